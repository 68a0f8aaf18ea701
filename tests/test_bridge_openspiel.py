"""The openspiel family: its index and specs, builders, left-out games and configs, a `step` that replays the live
OpenSpiel game exactly, seats that see only what they may, seeded bots, and conformance of every env."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from hubgym.bridges import openspiel_play as game
from hubgym.bridges import openspiel_verifier as verifier
from hubgym.bridges.openspiel import FAMILY, held_out
from hubgym.bridges.openspiel_games import GOLDEN_DIR, OPPONENTS, load_specs
from hubgym.conformance import check_env
from hubgym.conformance.checks import (check_builds, check_declaration, check_golden_cases, check_golden_extremes,
                                       check_ids_from_content, check_ids_unique, check_interaction, check_schema,
                                       check_verifier_loads)
from hubgym.conformance.context import Only
from hubgym.conformance.episodes import check_golden_replay
from hubgym.conformance.runner import iter_outcomes
from hubgym.conformance.splits import check_held_out_apart
from hubgym.envs.build import build_tasks
from hubgym.envs.resolve import known_config
from hubgym.errors import EnvContractError, EnvNotFoundError

SPECS = load_specs()


def task_of(env: str, seat: int = 0, seed: int = 7, config: str | None = None, max_invalid: int = 3) -> dict:
    spec = SPECS["envs"][env]
    opponent = spec["configs"][config or next(iter(spec["configs"]))]
    return {"info": {"game": spec["game"], "params": spec["params"], "seat": seat, "seed": seed, "opponent": opponent,
                     "max_invalid": max_invalid, "move_limit": spec["move_limit"]}}


def play(task: dict, choose) -> list[tuple]:
    """An episode whose moves `choose(position, seat)` picks (an action id); [(state, observation, reward, done)]."""
    state, _ = verifier.reset(task)
    steps = []
    while not state["result"]:
        position = game.replay(task["info"], state["history"])
        name = position.action_to_string(task["info"]["seat"], choose(position, task["info"]["seat"]))
        steps.append(verifier.step(task, state, f"<move>{name}</move>"))
        state = steps[-1][0]
    return steps


def test_the_index_lists_every_env_of_the_specs_and_each_ships_golden_cases():
    entries = FAMILY.entries()
    assert [e.name for e in entries] == sorted(SPECS["envs"]) and len(entries) >= 45
    for entry in entries:
        spec = SPECS["envs"][entry.name]
        assert entry.configs == tuple(spec["configs"]) and entry.configs[0] in ("random", "default")
        assert set(spec["configs"]) <= {*OPPONENTS, "default"} and (GOLDEN_DIR / f"{entry.name}.jsonl").is_file()
        assert spec["view"] in ("state", "observation", "information_state") and spec["move_limit"] >= 1
    assert {"os_chess", "os_go", "os_hex", "os_kuhn_poker", "os_leduc_poker", "os_backgammon",
            "os_connect_four", "os_tic_tac_toe", "os_othello", "os_checkers", "os_breakthrough"} <= set(SPECS["envs"])
    assert SPECS["envs"]["os_go"]["params"] == {"board_size": 9}


def test_left_out_games_and_configs_say_why_wherever_they_are_asked_for():
    with pytest.raises(EnvNotFoundError, match="'os_goofspiel' is not bridged: OpenSpiel's 'goofspiel' is left out: "
                                               "not turn-based: its players move simultaneously"):
        FAMILY.builder("os_goofspiel")
    with pytest.raises(EnvNotFoundError, match="os_chesss.*did you mean os_chess"):
        FAMILY.builder("os_chesss")
    assert "hard" not in SPECS["envs"]["os_chess"]["configs"]
    with pytest.raises(EnvContractError, match=r"env 'os_chess' has no config 'hard' \(left out: too slow: OpenSpiel's "
                                               r"MCTS bot took [\d.]+ s for its first move at 1000 simulations"):
        known_config(FAMILY.builder("os_chess"), "hard")
    assert all(reason for reason in SPECS["excluded"].values()) and "quoridor" in SPECS["excluded"]


@pytest.mark.slow
def test_listing_the_game_families_imports_neither_open_spiel_nor_gymnasium():
    """One child process for both game families (`hubgym envs` lists them without their packages)."""
    code = ("import sys; from hubgym.bridges.openspiel import FAMILY as A; from hubgym.bridges.gymnasium import "
            "FAMILY as B; assert A.entries() and B.entries(); print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('pyspiel', 'open_spiel', 'gymnasium', 'pygame')))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout.strip() == "[]", shown.stderr


@pytest.mark.parametrize("env", ["os_tic_tac_toe", "os_leduc_poker", "os_kuhn_poker", "os_connect_four"])
def test_step_rebuilds_the_game_and_agrees_with_a_live_game(env):
    """A live OpenSpiel state fed the same actions (the model's, the bot's, chance's) matches the replayed one at
    every step: the state JSON is the whole game."""
    task = task_of(env, seat=1, seed=11)
    rng = random.Random(3)
    steps = play(task, lambda position, seat: rng.choice(position.legal_actions(seat)))
    live = game.load_game(task["info"]["game"], json.dumps(task["info"]["params"])).new_initial_state()
    for action in steps[-1][0]["history"]:
        live.apply_action(action)
    assert str(live) == str(game.replay(task["info"], steps[-1][0]["history"]))
    assert steps[-1][3] and steps[-1][0]["result"] in ("over", "limit")
    assert steps[-1][2] == verifier.mapped(SPECS["envs"][env], live.returns()[1]) or steps[-1][0]["result"] == "limit"


def test_a_seat_of_an_imperfect_information_game_sees_its_own_information_only():
    """Kuhn poker: the observation is the seat's information state, never the state that shows both cards."""
    for seed in range(6):
        task = task_of("os_kuhn_poker", seat=seed % 2, seed=seed)
        state, observation = verifier.reset(task)
        position = game.replay(task["info"], state["history"])
        assert position.information_state_string(task["info"]["seat"]) in observation
        assert str(position) not in observation  # the whole state holds the other player's card


def test_bots_are_seeded_by_the_task_and_leave_the_global_generator_alone():
    before = random.getstate()
    openings = {}
    for config in ("random", "easy", "medium"):
        for seed in (1, 2):
            game._search.cache_clear()
            task = task_of("os_connect_four", seat=1, seed=seed, config=config)
            first = verifier.reset(task)
            game._search.cache_clear()
            assert verifier.reset(task) == first  # a fresh search gives the same move
            openings[config, seed] = first[0]["history"]
    assert random.getstate() == before
    assert len({tuple(h) for h in openings.values()}) > 1  # seeds and budgets choose other moves


def test_illegal_and_unreadable_moves_are_explained_counted_and_the_last_forfeits():
    task = task_of("os_tic_tac_toe", seat=0, seed=3)
    state, _ = verifier.reset(task)
    first = verifier.step(task, state, "I take the centre")
    assert first[0]["invalid"] == 1 and not first[3]
    assert first[1].startswith("Invalid move: 'I take the centre' is not a legal move; reply with one legal move "
                               "inside <move></move>, written as listed. 2 more invalid moves forfeit the game.")
    assert "x(1,1)" in first[1].split("Your legal moves: ")[1]
    second = verifier.step(task, first[0], "<move></move>")
    assert "no move found" in second[1] and second[0]["invalid"] == 2
    last = verifier.step(task, second[0], "<move>X(1,1) </move> no: <move>z9</move>")
    assert last[0]["result"] == "forfeit" and last[2:] == (0.0, True)
    assert verifier.step(task, last[0], "<move>x(1,1)</move>") == (last[0], "The game is over.", 0.0, True)
    played = verifier.step(task, state, "<move>X(1,1)</move>")  # case is folded where one move is meant
    assert played[0]["history"][:1] == [4] and played[0]["invalid"] == 0


def test_case_is_folded_only_where_it_names_one_move():
    legal = {"bxc3": 1, "Bxc3": 2, "e4": 3}
    assert verifier.parse_move("<move>Bxc3</move>", legal) == 2 and verifier.parse_move("BXC3", legal) is None
    assert verifier.parse_move("I play <move> E4 </move>", legal) == 3 and verifier.parse_move("e5", legal) is None


def test_the_move_limit_stops_the_game_at_the_return_of_the_unfinished_position():
    task = task_of("os_chess", seat=1, seed=5)
    steps = play(task, lambda position, seat: position.legal_actions(seat)[0])
    state, observation, reward, done = steps[-1]
    assert done and len(steps) <= task["info"]["move_limit"]
    if state["result"] == "limit":
        assert "Move limit reached (150 moves)" in observation and reward == 0.5


@pytest.mark.parametrize("change, field", [
    ({"game": "chess", "params": {"chess960": True}}, "info.game 'chess' with info.params"),
    ({"opponent": {"kind": "mcts", "simulations": 10**7}}, "info.opponent"),
    ({"move_limit": 10**6}, "info.move_limit"),
    ({"seat": 2}, "info.seat"),
    ({"game": "goofspiel", "params": {}}, "info.game 'goofspiel'"),
])
def test_a_stored_row_cannot_ask_for_what_the_family_does_not_ship(change, field):
    """Rows are untrusted: a hand-edited row asking for an unshipped game, budget or limit is refused, never run."""
    task = task_of("os_chess")
    task["info"].update(change)
    with pytest.raises(ValueError, match=field):
        verifier.reset(task)


def test_rows_vary_the_seat_and_train_never_shares_a_seed_with_test():
    built = build_tasks(FAMILY.builder("os_kuhn_poker"), "easy")
    seeds = {split: {row["info"]["seed"] for row in rows} for split, rows in built.items()}
    assert (len(built["train"]), len(built["test"])) == (200, 50) and not seeds["train"] & seeds["test"]
    assert all(held_out(seed) for seed in seeds["test"]) and not any(held_out(seed) for seed in seeds["train"])
    assert {row["info"]["seat"] for row in built["train"]} == {0, 1}
    row = built["test"][0]
    assert row["info"]["opponent"] == OPPONENTS["easy"] and row["interaction"]["max_turns"] == 2 + 3 - 1
    assert f"as player {row['info']['seat']} of 2 against OpenSpiel's MCTS bot (10 simulations a move)" in \
        row["prompt"][0]["content"]


CHEAP_CHECKS = [check_declaration, check_builds, check_schema, check_ids_unique, check_ids_from_content,
                check_held_out_apart, check_verifier_loads, check_interaction, check_golden_cases,
                check_golden_extremes, check_golden_replay]
"""What every env of the family is held to in the suite: its declaration, a build of 4 rows a split, its golden
cases and their replay. `hubgym check --source openspiel` runs every check (and the catalog's check is timed in
bench/RESULTS.md); REPRESENTATIVE runs them all here."""
REPRESENTATIVE = ["os_kuhn_poker", "os_backgammon"]
"""Imperfect information (an ISMCTS bot); chance and perfect information. Every check, the hash-seed check's second
process included, costs seconds an env: the rest of the family gets CHEAP_CHECKS."""


@pytest.mark.slow
def test_every_env_builds_and_replays_its_golden_cases():
    failures = {}
    for entry in FAMILY.entries():
        for result, _ in iter_outcomes(FAMILY.builder(entry.name), configs=Only.DEFAULT, build_rows=4,
                                       checks=CHEAP_CHECKS):
            if result.failed:
                failures.setdefault(entry.name, result.message)
    assert failures == {}, json.dumps(failures, indent=1)


@pytest.mark.slow
@pytest.mark.parametrize("env", REPRESENTATIVE)
def test_representative_envs_pass_every_check(env):
    failed = [r.message for r in check_env(FAMILY.builder(env), configs=Only.DEFAULT, max_rows=2, build_rows=4)
              if r.failed]
    assert not failed, failed
