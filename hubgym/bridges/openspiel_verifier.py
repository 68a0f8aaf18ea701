"""Verifier for the `os_*` envs: an OpenSpiel game, one seat played by the model against seeded bots.

    from hubgym.bridges.openspiel_verifier import reset, step
    task = {"info": {"game": "tic_tac_toe", "params": {}, "seat": 1, "seed": 7, "opponent": {"kind": "random"},
                     "max_invalid": 3, "move_limit": 5}}
    state, board = reset(task)                       # the bot (player 0) has moved; the board and legal moves
    state, observation, reward, done = step(task, state, "<move>x(1,1)</move>")

State (JSON): {"history": [int], "moves": int, "invalid": int, "result": str} -- every action applied to the
game so far (chance outcomes, the bots' moves and the model's, in order), the model's legal moves so far, its
invalid ones, and "" while the game runs, else "over" (the game ended), "limit" (the model made `move_limit`
moves) or "forfeit" (`max_invalid` invalid moves).

Pure: `step` loads the game (`info.game` with `info.params`), replays `state.history`, applies the model's move,
then plays on until the seat is to move again, all through hubgym.bridges.openspiel_play: chance outcomes and the
bots' moves (`info.opponent`) are drawn from hashes of (`info.seed`, ply). The same task, state and action give the
same answer in any process.

Observation: in a game of perfect information, what the other players and chance did since the model's last move
("Player 1 played e5."), then the state as OpenSpiel prints it; in a game of imperfect information only the seat's
own observation (or information-state) string. Then the seat's legal moves in the game's notation. A move is read
from the last <move>...</move> (else the whole reply) and must be written as listed (case is ignored where that
leaves one move); an illegal or unreadable move is answered with why and the legal moves, and counted.

Reward: the final step earns the seat's return mapped linearly from the game's [min_utility, max_utility] into
[0, 1] (a win of a two-player zero-sum game 1.0, a draw 0.5, a loss 0.0); at `move_limit` the game stops and
earns the return of the unfinished position (0 in most games: 0.5); a forfeit earns 0.0, every other step 0.0.
No per-move shaping. Metrics (weight 0): finished (the game reached its end), invalid_moves.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from hubgym.bridges.openspiel_games import spec_of_game
from hubgym.bridges.openspiel_play import advance, legal_at, replay, remember, view
from hubgym.schemas import Message, Task
from hubgym.verifiers.contract import actions_of

SEPARATOR = " | "  # between legal moves: move names hold spaces, commas and semicolons ('pile:1, take:2;')
_TAG = re.compile(r"<move>(.*?)</move>", re.S | re.I)


# -- the row, checked ---------------------------------------------------------------------------

def check_info(info: dict[str, Any]) -> dict[str, Any]:
    """The shipped spec of the row's game; a ValueError naming the field when the row asks for anything the family
    does not ship (rows are untrusted: no unshipped game, size or search budget)."""
    params_json = json.dumps(info.get("params", {}), sort_keys=True)
    spec = spec_of_game(str(info.get("game")), params_json)
    if spec is None:
        raise ValueError(f"info.game {info.get('game')!r} with info.params {params_json[:120]} is not a game the "
                         f"openspiel family ships")
    if info.get("opponent") not in spec["configs"].values():
        raise ValueError(f"info.opponent {info.get('opponent')!r} is none of the opponents of {spec['game']!r}: "
                         f"{', '.join(json.dumps(o, sort_keys=True) for o in spec['configs'].values())}")
    for key, ok in (("seat", lambda v: 0 <= v < spec["players"]), ("seed", lambda v: v >= 0),
                    ("max_invalid", lambda v: 1 <= v <= 10), ("move_limit", lambda v: v == spec["move_limit"])):
        value = info.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not ok(value):
            raise ValueError(f"info.{key} is {value!r}, out of bounds for {spec['game']!r}")
    return spec


# -- what the seat sees, and its moves ------------------------------------------------------------------

def show(spec: dict[str, Any], state: Any, seat: int, events: list[str], legal: dict[str, int]) -> str:
    """An observation: the others' moves, the game, the seat's legal moves `legal` (or the end)."""
    parts = ["\n".join(events)] if events else []
    parts.append(view(spec, state, seat))
    if not state.is_terminal():
        parts.append(f"You are player {seat}. Your legal moves: {SEPARATOR.join(legal)}")
    elif not any(event.startswith("You played") for event in events):
        parts.append("The game ended before your first turn: any reply ends the episode.")
    return "\n\n".join(parts)


def parse_move(action: str, legal: dict[str, int]) -> int | None:
    """The legal move the reply names (last <move> tag, else the whole reply); None when it names none."""
    found = _TAG.findall(action)
    text = (found[-1] if found else action).strip()
    if text in legal:
        return legal[text]
    folded: dict[str, list[int]] = {}
    for name, move in legal.items():
        folded.setdefault(_fold(name), []).append(move)
    hits = folded.get(_fold(text), [])
    return hits[0] if len(hits) == 1 else None  # 'bxc3' and 'Bxc3' are two chess moves: no case folding there


def _fold(text: str) -> str:
    return " ".join(text.lower().split())


def mapped(spec: dict[str, Any], value: float) -> float:
    """A return mapped linearly from the game's utility bounds into [0, 1]."""
    low, high = spec["utility"]
    return min(max((value - low) / (high - low), 0.0), 1.0)


# -- the MDP ----------------------------------------------------------------------------------------------

def reset(task: Task) -> tuple[dict, str]:
    """Play chance and the bots up to the seat's first move; show the game and the legal moves."""
    return opening(task["info"], check_info(task["info"]))


def step(task: Task, state: dict, action: str) -> tuple[dict, str, float, bool]:
    """Apply the seat's move and play on to its next turn; the final step earns the mapped return."""
    if state["result"]:
        return state, "The game is over.", 0.0, True
    return play_move(task["info"], check_info(task["info"]), state, action)


def opening(info: dict[str, Any], spec: dict[str, Any]) -> tuple[dict, str]:
    """`reset` for a row already checked against `spec`."""
    history: list[int] = []
    state = replay(info, history)
    events = advance(info, spec, state, history)
    remember(info, history, state)
    shown = show(spec, state, info["seat"], events, legal_at(info, history))
    return {"history": history, "moves": 0, "invalid": 0, "result": ""}, shown


def play_move(info: dict[str, Any], spec: dict[str, Any], state: dict, action: str) -> tuple[dict, str, float, bool]:
    """`step` of a running game, for a row already checked against `spec`."""
    seat = info["seat"]
    game_state, history = replay(info, state["history"]), list(state["history"])
    if game_state.is_terminal():  # the others ended the game before the seat's first turn (euchre: a partner alone)
        value = float(game_state.returns()[seat])
        return {**state, "result": "over"}, f"Game over before your turn. Your return: {value:g}.", \
            mapped(spec, value), True
    legal = legal_at(info, history)
    move = parse_move(action, legal)
    if move is None:
        return _invalid(info, state, action, legal)
    events = [f"You played {game_state.action_to_string(seat, move)}."]
    game_state.apply_action(move)
    history.append(move)
    events += advance(info, spec, game_state, history)
    remember(info, history, game_state)
    moves = state["moves"] + 1
    result = "over" if game_state.is_terminal() else "limit" if moves >= info["move_limit"] else ""
    new = {"history": history, "moves": moves, "invalid": state["invalid"], "result": result}
    text = show(spec, game_state, seat, events, legal_at(info, history))
    if not result:
        return new, text, 0.0, False
    value = float(game_state.returns()[seat])
    ending = "Game over." if result == "over" else f"Move limit reached ({info['move_limit']} moves): the game stops."
    return new, f"{text}\n\n{ending} Your return: {value:g}.", mapped(spec, value), True


def _invalid(info: dict[str, Any], state: dict, action: str, legal: dict[str, int]) -> tuple[dict, str, float, bool]:
    """Count an illegal or unreadable move; the `max_invalid`-th forfeits the game."""
    invalid = state["invalid"] + 1
    found = _TAG.findall(action)
    named = (found[-1] if found else action).strip()
    why = (f"{named[:80]!r} is not a legal move" if named else "no move found") + \
        "; reply with one legal move inside <move></move>, written as listed"
    if invalid >= info["max_invalid"]:
        return {**state, "invalid": invalid, "result": "forfeit"}, f"Invalid move: {why}. Too many invalid moves: " \
                                                                   f"you lose.", 0.0, True
    left = info["max_invalid"] - invalid
    text = (f"Invalid move: {why}. {left} more invalid {'move forfeits' if left == 1 else 'moves forfeit'} the game."
            f"\nYour legal moves: {SEPARATOR.join(legal)}")
    return {**state, "invalid": invalid}, text, 0.0, False


# -- metrics -------------------------------------------------------------------------------------------

def final_state(task: Task, completion: list[Message]) -> dict:
    """The state after the trajectory's actions, stopping where the episode ended (as the rollout loop does)."""
    state = _final_state(json.dumps(task["info"], sort_keys=True), tuple(actions_of(completion)))
    return {**state, "history": list(state["history"])}  # a copy: the memo's own is never handed out


@lru_cache(maxsize=64)
def _final_state(info_json: str, actions: tuple[str, ...]) -> dict:
    task = {"info": json.loads(info_json)}
    state, _ = reset(task)
    for action in actions:
        if state["result"]:
            break
        state = step(task, state, action)[0]
    return state


def finished(task: Task, completion: list[Message]) -> float:
    """1.0 when the game reached its end (not the move limit, not a forfeit): a metric, weight 0."""
    return float(final_state(task, completion)["result"] == "over")


def invalid_moves(task: Task, completion: list[Message]) -> float:
    """How many replies named no legal move (a metric, weight 0)."""
    return float(final_state(task, completion)["invalid"])


REWARDS = {finished: 0.0, invalid_moves: 0.0}
REWARD_RANGE = (0.0, 1.0)
SUCCESS_THRESHOLD = 1.0  # the seat's best return
