"""The gymnasium family: its index, builders, conformance, and a `step` that replays Gymnasium's own worlds exactly."""

from __future__ import annotations

import random

import pytest

from hubgym.bridges.gymnasium import ENVS, FAMILY, index_entries
from hubgym.bridges.gymnasium_verifier import parse_move, reset, step
from hubgym.bridges.gymnasium_worlds import WORLDS
from hubgym.conformance import check_env
from hubgym.conformance.checks import (check_builds, check_declaration, check_golden_cases, check_golden_extremes,
                                       check_ids_from_content, check_ids_unique, check_interaction, check_schema,
                                       check_verifier_loads)
from hubgym.conformance.episodes import check_golden_replay
from hubgym.conformance.runner import iter_outcomes
from hubgym.conformance.splits import check_held_out_apart
from hubgym.envs.build import build_tasks
from hubgym.errors import EnvNotFoundError


def task_of(env: str, config: str, seed: int) -> dict:
    cfg = next(c for c in ENVS[env].configs if c.name == config)
    return {"info": {"world": ENVS[env].world, "options": cfg.options, "seed": seed, "max_invalid": cfg.max_invalid,
                     "move_limit": cfg.move_limit}}


def play(task: dict, actions: list[str]) -> list[tuple]:
    state, _ = reset(task)
    steps = []
    for action in actions:
        state, observation, reward, done = step(task, state, action)
        steps.append((state, observation, reward, done))
        if done:
            break
    return steps


def test_the_shipped_index_is_the_familys_table():
    assert FAMILY.entries() == index_entries()
    assert [e.name for e in FAMILY.entries()] == ["gym_blackjack", "gym_cliff_walking", "gym_frozen_lake", "gym_taxi"]
    assert {e.name: e.configs for e in FAMILY.entries()}["gym_frozen_lake"] == (
        "4x4", "8x8", "random_4x4", "random_6x6", "random_8x8")
    with pytest.raises(EnvNotFoundError, match="gym_taxy.*did you mean gym_taxi"):
        FAMILY.builder("gym_taxy")


@pytest.mark.parametrize("env, config", [(env, c.name) for env in sorted(ENVS) for c in ENVS[env].configs])
def test_replaying_from_the_seed_is_what_a_live_gymnasium_env_does(env, config):
    """One live env stepped along, and `step` rebuilding the world from its seed at every turn, agree on every
    position, reward and end, whatever the slippery ice, the rain or the cards do."""
    task = task_of(env, config, seed=41)
    world, rng = WORLDS[task["info"]["world"]], random.Random(5)
    live = world.make(task["info"]["options"], task["info"]["seed"])
    state, observation = reset(task)
    assert world.render(live) in observation
    for _ in range(task["info"]["move_limit"]):
        move = rng.randrange(len(world.actions))
        _, reward, done, _, _ = live.step(move)
        state, observation, step_reward, over = step(task, state, f"<move>{world.actions[move]}</move>")
        assert world.render(live) in observation
        if done:
            assert over and step_reward == world.outcome(live, float(reward), True)
            break
        assert not over or state["result"] == "limit"


def test_replies_name_their_move_loosely_and_the_third_without_one_forfeits():
    lake = WORLDS["frozen_lake"]
    assert parse_move(lake, "Going <move>Right</move> now") == 2
    assert parse_move(lake, "left, then... I go down") == 1  # the last move named
    assert parse_move(lake, "<move>jump</move> right") is None  # a tag that names no move is no move
    task = task_of("gym_frozen_lake", "random_4x4", seed=3)
    steps = play(task, ["", "no idea", "<move>sideways</move>"])
    assert [s[0]["invalid"] for s in steps] == [1, 2, 3] and steps[-1][0]["result"] == "forfeit"
    assert steps[0][1].endswith("2 more invalid replies end the episode.") and steps[-1][2:] == (0.0, True)


def test_the_move_limit_stops_an_episode_with_nothing():
    task = task_of("gym_taxi", "default", seed=8)
    steps = play(task, ["north", "south"] * 30)
    assert len(steps) == 40 and steps[-1][0]["result"] == "limit" and steps[-1][2:] == (0.0, True)
    assert "Move limit reached (40 moves)" in steps[-1][1]


def test_a_world_never_touches_the_global_generators():
    numpy = pytest.importorskip("numpy")
    before = (random.getstate(), numpy.random.get_state(legacy=False)["state"]["key"].tolist())
    for env in sorted(ENVS):
        for config in ENVS[env].configs:
            play(task_of(env, config.name, seed=17), ["<move>down</move>", "hit", "east", "right"] * 3)
    assert (random.getstate(), numpy.random.get_state(legacy=False)["state"]["key"].tolist()) == before


@pytest.mark.slow
def test_deterministic_worlds_are_tasks_by_their_opening_and_never_cross_splits():
    """Taxi's 300 openings and random lake maps: a split never holds one twice, and test holds none of train's."""
    for env, config in (("gym_taxi", "default"), ("gym_frozen_lake", "random_6x6")):
        built = build_tasks(FAMILY.builder(env), config)
        openings = {split: [reset(row)[1] for row in rows] for split, rows in built.items()}
        assert all(len(set(o)) == len(o) for o in openings.values())
        assert not set(openings["train"]) & set(openings["test"])


CHEAP_CHECKS = [check_declaration, check_builds, check_schema, check_ids_unique, check_ids_from_content,
                check_held_out_apart, check_verifier_loads, check_interaction, check_golden_cases,
                check_golden_extremes, check_golden_replay]
"""What every config of the family is held to here; gym_blackjack, the one world with cards, gets every check."""


@pytest.mark.slow
def test_every_config_builds_and_replays_its_golden_cases():
    failures = {}
    for name in sorted(ENVS):
        for result, _ in iter_outcomes(FAMILY.builder(name), configs=None, build_rows=6, checks=CHEAP_CHECKS):
            if result.failed:
                failures.setdefault(name, result.message)
    assert failures == {}, failures


@pytest.mark.slow
def test_blackjack_passes_every_check():
    failed = [r.message for r in check_env(FAMILY.builder("gym_blackjack"), max_rows=3, build_rows=6) if r.failed]
    assert not failed, failed


@pytest.mark.parametrize("change, field", [
    ({"world": "lunar_lander"}, "info.world is 'lunar_lander'"),
    ({"options": {"random_size": 10**6, "is_slippery": False}}, "info.random_size"),
    ({"options": {"render_mode": "human"}}, "info.options"),
    ({"move_limit": 10**6}, "info.move_limit"),
    ({"options": {"map_name": "64x64", "is_slippery": True}}, "info.options.map_name"),
])
def test_a_stored_row_cannot_ask_for_what_the_family_does_not_ship(change, field):
    """Rows are untrusted: a hand-edited row asking for another world, a huge map or limit is refused, never run."""
    task = task_of("gym_frozen_lake", "4x4", seed=1)
    task["info"].update(change)
    with pytest.raises(ValueError, match=field):
        reset(task)
