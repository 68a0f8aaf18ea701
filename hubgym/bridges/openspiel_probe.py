"""Probe the installed OpenSpiel: which games become `os_*` envs, their specs, and their golden cases.

    python -m hubgym.bridges.openspiel_probe            # every registered game; writes the index, specs, golden
    python -m hubgym.bridges.openspiel_probe chess hex  # only these games (the others keep what the specs hold)

A game is bridged when OpenSpiel registers it as sequential (turn-based), loadable with its default parameters,
with chance as explicit outcomes (or none), and when random play shows that every seat's view can be printed at
each of its turns (the state for perfect information; the seat's observation or information-state string
otherwise), no two legal moves print alike, the move list fits a prompt, and a replay of the action history gives
the same state. Then a search for golden cases must find an episode against the `random` config that earns the
game's best return (full reward); a game where none is found is left out. Every left-out game gets its reason in
the specs' `excluded` (shown when it is asked for), every dropped config its reason in `dropped_configs`.

Budgets are counts, never times, so the probe writes the same files on every machine: games whose steps are too
slow (SLOW_STEPS) and MCTS configs whose bot is too slow (BOT_SECONDS) are tables of times measured by hand, which
the probe prints again as it goes (`bot_seconds` measures a bot).
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from hubgym.bridges import openspiel_games as games
from hubgym.bridges import openspiel_play as game_play
from hubgym.builders.families import FamilyEnv, write_index
from hubgym.files import atomic_write_bytes

PARAMS: dict[str, dict[str, Any]] = {"go": {"board_size": 9}}
"""Parameters other than OpenSpiel's defaults: go on a 9x9 board, whose games fit a prompt and the move limit."""
INFORMATION_STATE = frozenset({"coordinated_mp", "first_sealed_auction", "kuhn_poker", "leduc_poker",
                               "tiny_bridge_2p", "tiny_bridge_4p", "universal_poker"})
"""Games of imperfect information whose observation string drops what the seat has seen happen (kuhn's is '022';
its information state '0pb' keeps the bets): the seat is shown its information-state string instead."""
BY_HAND: dict[str, str] = {
    "crossword": "it has no legal-action list (OpenSpiel's `crossword` uses action structs only)",
    "quoridor": "OpenSpiel warns that its implementation has known issues (printed at every load)",
}
MOVE_LIMIT = 150  # the most moves a seat makes in one episode (a game that goes on stops there)
MAX_MOVES, MAX_MOVES_TEXT = 300, 4000  # a seat's legal moves must fit a prompt
SLOW_STEPS: dict[str, str] = {
    "bridge": "a step replays the game's history, which took 2.3 s at the end of a deal (OpenSpiel scores a "
              "finished deal by solving it double-dummy) and 3.6 s in another run",
    "kriegspiel": "a step replays the game's history, which took 67 ms at the end of a random game (each move is "
                  "checked against the hidden board and umpired), over the family's 50 ms",
    "shogi": "a step replays the game's history, which took 174 ms at the end of a random game, over the "
             "family's 50 ms",
}
"""Games whose steps are too slow: the slowest replay of `playouts`, measured on a busy 2-core machine (the probe
prints what it measures; the decision is this table, so the probe writes the same files everywhere)."""
PLAYOUTS = 12  # random games per probed game
SEARCH_SIMULATIONS, SEARCH_EPISODES, RANDOM_EPISODES = 60, 8, 300  # the golden search's budget
RANDOM_STEPS = 6000  # and at most this many of the seat's moves in random episodes
WINS = 3  # the golden win is the shortest of the first WINS found
SIZES = {"train": 200, "test": 50}
BOT_SECONDS: dict[str, dict[str, float]] = {
    "amazons": {"hard": 4.0}, "antichess": {"hard": 2.3}, "backgammon": {"medium": 2.4, "hard": 27.2},
    "banqi": {"hard": 2.2}, "checkers": {"hard": 3.7}, "chess": {"medium": 3.3, "hard": 27.4},
    "crazyhouse": {"medium": 7.0, "hard": 68.9}, "go": {"hard": 3.0}, "gomoku": {"hard": 2.1},
    "lines_of_action": {"medium": 2.1, "hard": 20.2}, "mnk": {"medium": 6.3, "hard": 65.8}, "othello": {"hard": 5.5},
    "ultimate_tic_tac_toe": {"hard": 1.1}, "universal_poker": {"hard": 1.5},
    "xiangqi": {"easy": 1.5, "medium": 11.6, "hard": 112.9}, "y": {"hard": 2.8}, "yacht": {"medium": 5.9, "hard": 36.7},
}
"""Seconds OpenSpiel's MCTS bot took for the first move of a game, where over BOT_LIMIT_S: `bot_seconds` on a busy
2-core machine (other configs of these games, and every config of the others, took less)."""
BOT_LIMIT_S = 1.0
TOO_SLOW: dict[tuple[str, str], str] = {
    (game, config): (f"too slow: OpenSpiel's MCTS bot took {seconds:g} s for its first move at "
                     f"{games.OPPONENTS[config]['simulations']} simulations (a busy 2-core machine; the family drops "
                     f"a bot over {BOT_LIMIT_S:g} s a move)")
    for game, configs in BOT_SECONDS.items() for config, seconds in configs.items()}
"""(game, config) -> why the config is left out."""
TAGS_BY_INFO = {"PERFECT_INFORMATION": "perfect_information", "IMPERFECT_INFORMATION": "imperfect_information"}


def game_type(name: str) -> Any:
    import pyspiel

    return next(t for t in pyspiel.registered_games() if t.short_name == name)


def rule_out(kind: Any) -> str | None:
    """Why a registered game cannot be an env by its type alone, or None."""
    import pyspiel

    if kind.short_name in BY_HAND or kind.short_name in SLOW_STEPS:
        return BY_HAND.get(kind.short_name) or SLOW_STEPS[kind.short_name]
    if kind.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        return "not turn-based: its players move simultaneously"
    if kind.dynamics == pyspiel.GameType.Dynamics.MEAN_FIELD:
        return "not a game between seats: a mean-field game"
    if not kind.default_loadable:
        return "a wrapper: it needs another game (or a file) as a parameter"
    if kind.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
        return ("its chance is drawn inside the game object (sampled stochastic), not as chance outcomes, so a game "
                "rebuilt from its action history cannot replay it from the task's seed")
    return None


def view_of(kind: Any) -> str:
    import pyspiel

    if kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION:
        return "state"
    if kind.short_name in INFORMATION_STATE or not kind.provides_observation_string:
        return "information_state"
    return "observation"


def base_spec(name: str) -> dict[str, Any]:
    """The spec of a game before probing: what OpenSpiel declares."""
    kind, params = game_type(name), PARAMS.get(name, {})
    game = game_play.load_game(name, json.dumps(params, sort_keys=True))
    players = game.num_players()
    return {"game": name, "params": params, "title": kind.long_name, "players": players, "view": view_of(kind),
            "move_limit": min(MOVE_LIMIT, game.max_game_length()), "utility": [game.min_utility(), game.max_utility()],
            "configs": dict(games.SOLO) if players == 1 else dict(games.OPPONENTS), "sizes": dict(SIZES),
            "tags": tags(kind, players),
            "description": f"play {kind.long_name} " + ("alone" if players == 1 else "against seeded bots") +
                           f" (OpenSpiel {name})"}


def tags(kind: Any, players: int) -> list[str]:
    import pyspiel

    chance = kind.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC
    return ["games", "openspiel", TAGS_BY_INFO.get(kind.information.name, "one_shot"),
            "single_player" if players == 1 else "multi_player", *(["chance"] if chance else [])]


def playouts(spec: dict[str, Any]) -> str | None:
    """Random games from random seats: why the game fails the contract, or None. Sets the spec's move limit to the
    most moves one player made in a random game (at most MOVE_LIMIT, at most OpenSpiel's own bound)."""
    import time


    slowest, most_moves = 0.0, 1
    for seed in range(PLAYOUTS):
        info = _info(spec, seed % spec["players"], seed)
        state, history, rng, moves = game_play.replay(info, []), [], random.Random(seed), {}
        while not state.is_terminal():
            if state.is_chance_node():
                action = game_play.chance_outcome(state, seed, len(history))
            else:
                problem = _check_turn(spec, state, state.current_player())
                if problem:
                    return problem
                action = rng.choice(state.legal_actions())
                moves[state.current_player()] = moves.get(state.current_player(), 0) + 1
            state.apply_action(action)
            history.append(action)
            if len(history) > 20_000:
                return "a random game did not end within 20,000 actions"
        most_moves = max([most_moves, *moves.values()])
        started = time.perf_counter()
        again = game_play.replay(info, history)
        slowest = max(slowest, time.perf_counter() - started)
        if str(again) != str(state):
            return "a replay of a game's action history does not give the same state"
    print(f"  {spec['game']}: the slowest replay of a random game took {slowest * 1000:.1f} ms", flush=True)
    spec["move_limit"] = min(spec["move_limit"], most_moves)
    return None


def _check_turn(spec: dict[str, Any], state: Any, seat: int) -> str | None:
    from hubgym.bridges import openspiel_verifier as verifier

    names = [state.action_to_string(seat, a) for a in state.legal_actions(seat)]
    if len(set(names)) != len(names):
        return "two legal moves print the same, so a reply cannot name one"
    if any(verifier.SEPARATOR in n or not n.strip() for n in names):
        return f"a legal move prints empty or holds the list separator {verifier.SEPARATOR!r}"
    if len(names) > MAX_MOVES or len(verifier.SEPARATOR.join(names)) > MAX_MOVES_TEXT:
        return f"too many legal moves to list in a prompt ({len(names)} at one turn)"
    try:
        if not game_play.view(spec, state, seat).strip():
            return "the seat's view prints empty"
    except Exception as exc:  # noqa: BLE001 - OpenSpiel raises SpielError for an unimplemented view
        return f"the seat's view cannot be printed ({str(exc).splitlines()[0][:100]})"
    return None


def _info(spec: dict[str, Any], seat: int, seed: int, config: str | None = None) -> dict[str, Any]:
    opponent = spec["configs"][config or next(iter(spec["configs"]))]
    return {"game": spec["game"], "params": spec["params"], "seat": seat, "seed": seed, "opponent": opponent,
            "max_invalid": 3, "move_limit": spec["move_limit"]}


def search_golden(spec: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Golden cases: an episode earning full reward (found by random play, then by MCTS play that sees the whole
    state), one that does not, and a forfeit; None when no episode earned full reward."""
    win = loss = None
    wins = steps = 0
    plans = [("random", e) for e in range(RANDOM_EPISODES)] + [("search", e) for e in range(SEARCH_EPISODES)]
    for policy, episode in plans:
        if policy == "random" and steps >= RANDOM_STEPS:
            continue
        seat, seed = episode % spec["players"], 1000 + episode
        try:
            actions, reward = play(spec, _info(spec, seat, seed), policy)
        except RuntimeError:  # OpenSpiel's MCTS refuses games with rewards before the end (2048)
            break
        case, steps = (seat, seed, actions, reward), steps + len(actions)
        if reward == 1.0:
            wins += 1
            win = case if win is None or len(actions) < len(win[2]) else win
        elif loss is None or len(actions) < len(loss[2]):
            loss = case
        if wins >= WINS and loss is not None:
            break
    if win is None:
        return None
    cases = [_case(spec, "a win against the random opponent", *win)]
    if loss is not None:
        cases.append(_case(spec, "a game that does not earn full reward", *loss))
    forfeit = ["I resign.", "<move>no such move</move>", ""]
    cases.append(_case(spec, "three invalid moves forfeit", win[0], win[1], forfeit, 0.0))
    return cases


def play(spec: dict[str, Any], info: dict[str, Any], policy: str) -> tuple[list[str], float]:
    """One episode of the seat played at random (seeded) or by full-state MCTS; (its actions, its reward)."""
    import pyspiel

    from hubgym.bridges import openspiel_verifier as verifier

    rng, total, actions = random.Random(info["seed"]), 0.0, []
    state, _ = verifier.opening(info, spec)
    while not state["result"]:
        position = game_play.replay(info, state["history"])
        if position.is_terminal():  # the game ended before the seat's first turn
            move = None
        elif policy == "random":
            move = rng.choice(position.legal_actions(info["seat"]))
        else:
            game = game_play.load_game(info["game"], json.dumps(info["params"], sort_keys=True))
            seed = len(actions) + info["seed"]
            bot = pyspiel.MCTSBot(game, pyspiel.RandomRolloutEvaluator(1, seed), 2.0, SEARCH_SIMULATIONS, 512, True,
                                  seed, False)
            move = bot.step(position)
        actions.append("" if move is None else f"<move>{position.action_to_string(info['seat'], move)}</move>")
        state, _, reward, _ = verifier.play_move(info, spec, state, actions[-1])
        total += reward
    return actions, total


def _case(spec: dict[str, Any], name: str, seat: int, seed: int, actions: list[str], reward: float) -> dict[str, Any]:
    info = _info(spec, seat, seed)
    turns = {"kind": "multi_turn", "max_turns": spec["move_limit"] + info["max_invalid"] - 1}
    return {"name": name, "task": {"info": info, "interaction": turns}, "actions": actions, "reward": reward}


def mcts_problem(spec: dict[str, Any]) -> str | None:
    """Why the MCTS configs cannot play this game (the bot fails at a seat's first turn), or None."""
    from hubgym.bridges import openspiel_verifier as verifier

    for seat in range(spec["players"]):
        info = _info(spec, (seat + 1) % spec["players"], 7, "easy")  # the bot plays `seat`'s turns
        try:
            verifier.opening(info, spec)
        except Exception as exc:  # noqa: BLE001 - OpenSpiel's own reason is the message
            text = str(exc).splitlines()[0][:120].rstrip(".")
            return (f"OpenSpiel's information-set MCTS bot (the bot of a game of imperfect information, which must "
                    f"not see the model's hidden state) cannot play it: {text}")
    return None


def bot_seconds(spec: dict[str, Any]) -> dict[str, float]:
    """Seconds an MCTS bot takes for the first move of the game, per config (to fill TOO_SLOW by hand)."""
    import time

    from hubgym.bridges import openspiel_verifier as verifier

    opening = game_play.replay(_info(spec, 0, 3), [])
    while opening.is_chance_node():
        opening.apply_action(game_play.chance_outcome(opening, 3, len(opening.history())))
    seat = (opening.current_player() + 1) % spec["players"]  # a seat that moves after the bot's first move
    seconds = {}
    for config, opponent in spec["configs"].items():
        if opponent["kind"] == "mcts":
            started = time.perf_counter()
            verifier.opening(_info(spec, seat, 3, config), spec)
            seconds[config] = round(time.perf_counter() - started, 3)
    return seconds


def probe(name: str) -> tuple[dict[str, Any] | None, str | None, dict[str, str]]:
    """(spec, None, dropped configs) of a game that becomes an env, else (None, why it is left out, {})."""
    reason = rule_out(game_type(name))
    if reason:
        return None, reason, {}
    spec = base_spec(name)
    reason = playouts(spec)
    if reason:
        return None, reason, {}
    dropped: dict[str, str] = {}
    if spec["players"] > 1:
        why = mcts_problem(spec)
        for config in [c for c, o in spec["configs"].items() if o["kind"] == "mcts"]:
            why_config = why or TOO_SLOW.get((name, config))
            if why_config:
                dropped[config] = why_config
                del spec["configs"][config]
    golden = search_golden(spec)
    if golden is None:
        return None, (f"no episode against the random opponent reached its best return ({spec['utility'][1]:g}) in "
                      f"up to {RANDOM_EPISODES} random episodes ({RANDOM_STEPS} moves) and {SEARCH_EPISODES} "
                      f"MCTS-played ones, so no golden case earns full reward"), {}
    spec["golden"] = golden
    return spec, None, dropped


MARK = "HUBGYM-OPENSPIEL-PROBE "


def probe_elsewhere(name: str) -> tuple[dict[str, Any] | None, str | None, dict[str, str]]:
    """`probe(name)` in a child process: OpenSpiel's C++ can crash the process it runs in (morpion_solitaire
    segfaults in some positions), and such a game is left out with that reason instead of ending the probe."""
    import signal
    import subprocess

    done = subprocess.run([sys.executable, "-m", "hubgym.bridges.openspiel_probe", "--one", name], capture_output=True,
                          text=True)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            spec, why, left = json.loads(line[len(MARK):])
            return spec, why, left
        print(line, flush=True)
    if done.returncode < 0:
        return None, f"OpenSpiel crashed ({signal.Signals(-done.returncode).name}) while the probe played it", {}
    last = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("OpenSpiel exception")]
    return None, f"the probe could not play it: {(last or ['no output'])[-1][:160]}", {}


def _probe_one(name: str) -> None:
    """The child's side of `probe_elsewhere`: one marked JSON line on stdout."""
    try:
        found = probe(name)
    except Exception as exc:  # noqa: BLE001 - a game the probe cannot play is left out, with OpenSpiel's reason
        found = (None, f"the probe could not play it: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", {})
    print(MARK + json.dumps(found), flush=True)


def main(names: list[str]) -> None:
    import pyspiel

    old = json.loads(games.SPECS.read_text()) if games.SPECS.exists() else {"envs": {}, "excluded": {},
                                                                             "dropped_configs": {}}
    todo = names or sorted(t.short_name for t in pyspiel.registered_games())
    envs, excluded, dropped = dict(old["envs"]), dict(old["excluded"]), dict(old["dropped_configs"])
    for name in todo:
        env = games.PREFIX + name
        envs.pop(env, None), excluded.pop(name, None), dropped.pop(env, None)
        spec, why, left = probe_elsewhere(name)
        print(f"{name}: {'env' if spec else 'left out: ' + str(why)}", flush=True)
        if spec is None:
            excluded[name] = why
        else:
            golden = spec.pop("golden")
            text = "".join(json.dumps(case, sort_keys=True) + "\n" for case in golden)
            atomic_write_bytes(games.GOLDEN_DIR / f"{env}.jsonl", text.encode())
            envs[env] = spec
            dropped.update({env: left} if left else {})
        _write(envs, excluded, dropped)  # after every game: an interrupted probe keeps what it found
    for stale in games.GOLDEN_DIR.glob(f"{games.PREFIX}*.jsonl"):
        if stale.stem not in envs:  # a game left out now that was an env before
            stale.unlink()


def _write(envs: dict[str, Any], excluded: dict[str, str], dropped: dict[str, dict[str, str]]) -> None:
    specs = {"version": _version(), "envs": dict(sorted(envs.items())),
             "excluded": dict(sorted(excluded.items())), "dropped_configs": dict(sorted(dropped.items()))}
    atomic_write_bytes(games.SPECS, (json.dumps(specs, indent=1) + "\n").encode())  # configs keep their order
    write_index(games.INDEX, [FamilyEnv(env, "multi_turn", tuple(spec["configs"]), tuple(spec["tags"]), "openspiel",
                                        spec["description"]) for env, spec in sorted(envs.items())])


def _version() -> str:
    from importlib.metadata import version

    return version("open_spiel")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        _probe_one(sys.argv[2])
    else:
        main(sys.argv[1:])
