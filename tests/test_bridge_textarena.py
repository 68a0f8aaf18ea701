"""The textarena family: its index, builders, conformance, and a `step` that replays the live engine exactly."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import threading
from typing import Iterator

import pytest

from hubgym.bridges.textarena import FAMILY, GAMES, TextArenaConfig, index_entries, max_turns, variants
from hubgym.envs.build import build_tasks, make_builder
from hubgym.conformance import check_env
from hubgym.conformance.checks import per_env_checks
from hubgym.errors import EnvContractError, EnvNotFoundError
from hubgym.bridges.textarena_verifier import _drain, engine_class, private_random, reset, step

SEED = 11


NO_TURN_LIMIT = {"ta_sudoku"}  # valid moves fill cells, so they run out (or solve it) long before the turn limit


def task_of(name: str, config: str = "default", seed: int = SEED, max_invalid: int = 3) -> dict:
    game = GAMES[name]
    return {"info": {"game": game.engine, "options": variants(game.textarena_id)[config], "seed": seed,
                     "max_invalid": max_invalid}}


def opening(game: str, options: dict, seed: int):
    """The game right after reset, with its hidden state (the secret number or code, the solved grid)."""
    with private_random(game):
        env = engine_class(game)(**options)
        env.reset(num_players=1, seed=seed)
        return env


def losing_moves(task: dict) -> Iterator[str]:
    """Valid moves that never win: a game played with them runs to its turn limit."""
    info = task["info"]
    game, options = info["game"], info["options"]
    if game == "tower_of_hanoi":
        return itertools.cycle(["[A B]", "[B A]"])
    if game == "lights_out":
        return itertools.repeat("[0 0]")
    env = opening(game, options, info["seed"])
    if game == "frozen_lake":  # back and forth between the start and a safe neighbour
        (row, col), grid = env.state.game_state["player_pos"], env.state.game_state["grid"]
        steps = {"down": (1, 0), "up": (-1, 0), "right": (0, 1), "left": (0, -1)}
        back = {"down": "up", "up": "down", "right": "left", "left": "right"}
        safe = next(m for m, (dr, dc) in steps.items() if 0 <= row + dr < len(grid) and 0 <= col + dc < len(grid)
                    and grid[row + dr][col + dc] == " ")
        return itertools.cycle([f"[{safe}]", f"[{back[safe]}]"])
    if game == "sudoku":  # right digits, all but the last empty cell
        empty = [(i, j) for i in range(9) for j in range(9) if env.game_board[i][j] == 0]
        return iter([f"[{i + 1} {j + 1} {env.full_grid[i][j]}]" for i, j in empty[:-1]])
    if game == "guess_the_number":
        target = env.state.game_state["game_number"]
        return (f"[{n}]" for n in range(options["min_number"], options["max_number"] + 1) if n != target)
    code = env.state.game_state["secret_code"]
    digits = range(1, options["num_numbers"] + 1)
    guesses = (itertools.product(digits, repeat=options["code_length"]) if options["duplicate_numbers"]
               else itertools.permutations(digits, options["code_length"]))
    return ("[" + " ".join(map(str, g)) + "]" for g in guesses if list(g) != code)


def play(task: dict, actions: list[str]) -> list[tuple]:
    state, _ = reset(task)
    steps = []
    for action in actions:
        state, observation, reward, done = step(task, state, action)
        steps.append((state, observation, reward, done))
        if done:
            break
    return steps


def test_the_shipped_index_is_what_the_installed_textarena_yields():
    assert FAMILY.entries() == index_entries()
    assert [e.name for e in FAMILY.entries()] == sorted(GAMES) and len(GAMES) >= 3
    assert all(e.name.startswith(FAMILY.prefix) and e.kind == "multi_turn" and e.configs[0] == "default"
               for e in FAMILY.entries())
    configs = {e.name: e.configs for e in FAMILY.entries()}
    assert configs["ta_tower_of_hanoi"] == ("default", "medium", "hard", "hardcore", "extreme")
    assert "hard" not in configs["ta_sudoku"]  # left out: see the family's docstring


@pytest.mark.slow
def test_listing_the_family_does_not_import_textarena():
    code = ("import sys; from hubgym.bridges.textarena import FAMILY; assert FAMILY.entries(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('textarena', 'nltk')))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout.strip() == "[]", shown.stderr


def test_builder_is_one_cached_class_per_game_and_unknown_names_are_refused():
    hanoi = FAMILY.builder("ta_tower_of_hanoi")
    assert hanoi is FAMILY.builder("ta_tower_of_hanoi") and hanoi.ENV == "ta_tower_of_hanoi"
    assert hanoi.KIND == "multi_turn" and hanoi.TAGS == GAMES["ta_tower_of_hanoi"].tags
    assert hanoi.config_names() == ["default", "medium", "hard", "hardcore", "extreme"]
    assert "Version history" in hanoi.__doc__ and "options.max_turns + 1" in hanoi.__doc__
    with pytest.raises(EnvNotFoundError, match="ta_tower_of_hanoy.*did you mean ta_tower_of_hanoi"):
        FAMILY.builder("ta_tower_of_hanoy")


SLOW_TO_CHECK = {"ta_sudoku", "ta_frozen_lake",  # 5-15 s each: boards to build, 103-reply episodes to replay
                 "ta_mastermind"}  # every check, the scoring process's too


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TO_CHECK else n
                                  for n in sorted(GAMES)])
def test_every_game_passes_conformance(name):
    """Every check but the scoring process's (other processes, fresh imports, thousands of calls: they test the
    family's one verifier module, so they run on one game, ta_mastermind)."""
    checks = None if name == "ta_mastermind" else per_env_checks()
    failed = [r.message for r in check_env(FAMILY.builder(name), max_rows=10, checks=checks) if not r.ok]
    assert not failed, failed  # `hubgym check`: 200 rows


def test_rows_hold_the_game_and_seed_and_train_never_shares_a_seed_with_test():
    built = build_tasks(FAMILY.builder("ta_mastermind"), "hard")
    train, test = built["train"], built["test"]
    assert (len(train), len(test)) == (200, 50)
    seeds = {split: {row["info"]["seed"] for row in rows} for split, rows in (("train", train), ("test", test))}
    assert not seeds["train"] & seeds["test"] and len(seeds["train"]) == 200
    row = test[0]
    assert row["info"]["game"] == "mastermind" and row["info"]["options"]["num_numbers"] == 8
    assert row["interaction"]["max_turns"] == 30 + 1 + 3 - 1 and row["difficulty"] == "hard"
    assert "Mastermind" in row["prompt"][0]["content"] and "3rd invalid move" in row["prompt"][0]["content"]


@pytest.mark.parametrize(("name", "config"), [(n, c) for n in sorted(set(GAMES) - NO_TURN_LIMIT)
                                              for c in variants(GAMES[n].textarena_id, GAMES[n].skip)])
def test_a_game_of_valid_losing_moves_ends_exactly_at_the_rows_max_turns(name, config):
    """Two invalid moves, then valid ones that never win: the last reply the row allows ends the game."""
    task = task_of(name, config)
    allowed = max_turns(GAMES[name], TextArenaConfig(name=config, options=task["info"]["options"]))
    steps = play(task, ["no move here", "still none", *itertools.islice(losing_moves(task), allowed)])
    assert len(steps) == allowed
    state, observation, reward, done = steps[-1]
    assert done and state["result"] == "over" and state["invalid"] == 2 and 0.0 <= reward < 1.0
    assert not any(s[3] for s in steps[:-1]) and all(s[2] == 0.0 for s in steps[:-1])


@pytest.mark.parametrize("name", sorted(GAMES))
def test_replaying_from_the_seed_shows_what_the_live_engine_shows(name):
    """One live TextArena env, stepped along (seeded through the global generator, as TextArena runs it), and
    `step` rebuilding the game from seed and history at every turn, show the same text at every turn."""
    task = task_of(name, seed=SEED + 1)
    info = task["info"]
    actions = ["not a move", *itertools.islice(losing_moves(task), 8)]
    live = engine_class(info["game"])(**info["options"])
    live.reset(num_players=1, seed=info["seed"])
    live.state.error_allowance = 1 << 30
    state, observation = reset(task)
    assert observation == _drain(live) and observation
    for action in actions:
        live.step(action)
        shown = _drain(live)
        state, observation, _, done = step(task, state, action)
        assert observation.startswith(shown) and shown
        if done:
            break
    assert state["actions"] == actions[:len(state["actions"])] and state["seed"] == info["seed"]


def test_step_leaves_the_global_random_generator_alone_and_threads_do_not_mix():
    tasks = [task_of(name, seed=SEED + i) for i, name in enumerate(sorted(GAMES))]
    episodes = {i: ["x", *itertools.islice(losing_moves(t), 6)] for i, t in enumerate(tasks)}
    play(tasks[0], ["[1]"])  # the first import of TextArena (and NLTK) draws from the global generator
    before = random.getstate()
    serial = {i: play(t, episodes[i]) for i, t in enumerate(tasks)}
    assert random.getstate() == before
    threaded: list[list] = [[] for _ in range(2 * len(tasks))]  # each game twice, all at once
    workers = [threading.Thread(
                   target=lambda j=j: threaded[j].extend(play(tasks[j % len(tasks)], episodes[j % len(tasks)])))
               for j in range(len(threaded))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert threaded == [serial[j % len(tasks)] for j in range(len(threaded))]


def test_invalid_moves_are_explained_counted_and_the_last_one_forfeits():
    task = task_of("ta_guess_the_number")
    steps = play(task, ["seven", "[7]", "[7]", "[99]"])
    assert [s[0]["invalid"] for s in steps] == [1, 1, 2, 3]
    first, _, repeated, last = (s[1] for s in steps)
    assert "did not respond with valid '[number]'" in first and "Invalid moves: 1; 2 more end the game." in first
    assert "already guessed" in repeated and "1 more ends the game" in repeated
    assert "outside the range" in last and last.endswith("invalid move 3 of 3 allowed: you lose.")
    assert steps[-1][0]["result"] == "forfeit" and steps[-1][2:] == (0.0, True)
    assert step(task, steps[-1][0], "[1]") == (steps[-1][0], "The game is over.", 0.0, True)
    one = play(task_of("ta_guess_the_number", max_invalid=1), ["seven"])
    assert one[-1][0]["result"] == "forfeit" and one[-1][3]


def test_bad_configs_and_rows_are_refused_naming_the_field():
    base = FAMILY.builder("ta_lights_out")
    bad = type("BadLightsOut", (base,), {"BUILDER_CONFIGS": [
        TextArenaConfig(name="zero", options={"size": 5, "max_turns": 20}, max_invalid=0, sizes={"test": 1}),
        TextArenaConfig(name="typo", options={"size": 5, "max_turns": 20, "colour": "red"}, sizes={"test": 1})]})
    with pytest.raises(EnvContractError, match=r"max_invalid is 0 .*field='max_invalid'"):
        next(make_builder(bad, "zero").generate_tasks("test", size=1, seed=0))
    with pytest.raises(EnvContractError, match=r"'colour', not an argument of 'lights_out'.*field='options'"):
        next(make_builder(bad, "typo").generate_tasks("test", size=1, seed=0))
    with pytest.raises(ValueError, match="info.game is 'chess', not one of"):
        reset({"info": {"game": "chess", "options": {}, "seed": 1, "max_invalid": 3}})


@pytest.mark.slow
def test_a_real_rollout_of_two_games_replays_exactly(tiny_model, tmp_path):
    """vLLM's tiny model plays whole games (its replies held to the games' move formats, so episodes run many
    steps, with valid and invalid moves), and `hubgym replay` reproduces every observation, reward and token."""
    from typer.testing import CliRunner

    from hubgym.cli import app
    from hubgym.hub.rollouts import iter_rollouts
    from hubgym.engines import SamplingArgs, VLLMEngine
    from hubgym.rollout.run import RolloutConfig, run_rollouts

    engine = VLLMEngine(str(tiny_model), max_model_len=2048, enforce_eager=True)
    formats = {"ta_guess_the_number": r"I guess \[[1-9]\]", "ta_tower_of_hanoi": r"\[[ABC] [ABC]\]"}
    for env, move in formats.items():
        run_rollouts(RolloutConfig(envs=[env], model=str(tiny_model), out=str(tmp_path / env), n=2, limit=1,
                                   sampling=SamplingArgs(max_tokens=16, regex=move), max_model_len=2048),
                     engine=engine, progress=False)
    engine.close()
    rows = list(iter_rollouts([tmp_path / env for env in formats]))
    assert {r["env"] for r in rows} == set(formats) and all(r["error"] is None for r in rows)
    assert max(r["num_turns"] for r in rows) >= 5  # whole games, not one step
    assert any("Invalid moves:" in m["content"] for r in rows for m in r["completion"] if m["role"] == "user")
    shown = CliRunner().invoke(app, ["replay", *(str(tmp_path / env) for env in formats), "--model", str(tiny_model)],
                               env={"COLUMNS": "240"})
    assert shown.exit_code == 0, shown.output
    assert all(env in shown.output for env in formats) and "first divergences" not in shown.output


def test_a_stored_row_cannot_ask_for_a_game_of_a_size_no_config_ships():
    """Stored rows are untrusted: a hand-edited row asking for a million disks is a verifier error, not a hang."""
    from hubgym.bridges.textarena import FAMILY

    builder = FAMILY.builder("ta_tower_of_hanoi")
    task = builder.golden_cases()[0].task
    task = {**task, "info": {**task["info"], "options": {**task["info"]["options"], "num_disks": 1_000_000}}}
    with pytest.raises(ValueError, match="not the arguments of any difficulty variant"):
        builder.verifier().reset(task)
