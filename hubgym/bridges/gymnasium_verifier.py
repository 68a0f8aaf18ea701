"""Verifier for the `gym_*` envs: Gymnasium's toy-text worlds, rebuilt from their seed at every step.

    from hubgym.bridges.gymnasium_verifier import reset, step
    task = {"info": {"world": "frozen_lake", "options": {"random_size": 4, "is_slippery": False}, "seed": 5,
                     "max_invalid": 3, "move_limit": 16}}
    state, board = reset(task)
    state, observation, reward, done = step(task, state, "<move>right</move>")

A move is the last move word of the reply's last <move>...</move> (else of the whole reply), case ignored.

State (JSON): {"actions": [int], "invalid": int, "result": str} -- the Gymnasium actions taken so far, the
invalid replies, and "" while the episode runs, else "over" (the world ended it), "limit" (`move_limit` moves)
or "forfeit" (`max_invalid` invalid replies).

Pure: each call builds the world anew (`make(options, seed)`: Gymnasium's `reset(seed=...)`, whose generator
belongs to the env, never the process's) and replays the stored actions, so a slippery step or a card drawn
is the same in any process. A replay costs microseconds per action.

Reward: the final step earns the world's outcome (hubgym.bridges.gymnasium_worlds): 1.0 for reaching the goal
(Frozen Lake, Cliff Walking) or delivering the passenger (Taxi), Blackjack's +1/0/-1 mapped to 1.0/0.5/0.0; an
episode stopped at `move_limit` or forfeited earns 0.0, every other step 0.0. Metrics (weight 0): gym_return (the
sum of Gymnasium's own rewards), invalid_moves.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from hubgym.bridges.gymnasium_worlds import WORLDS, World
from hubgym.schemas import Message, Task
from hubgym.verifiers.contract import actions_of

SEPARATOR = " | "
_TAG = re.compile(r"<move>(.*?)</move>", re.S | re.I)
OPTIONS = {"map_name", "random_size", "is_slippery", "is_rainy"}
LIMITS = {"move_limit": (1, 200), "max_invalid": (1, 10), "random_size": (2, 12)}  # rows are untrusted


def world_of(info: dict[str, Any]) -> World:
    """The row's world, with its options and limits checked (a ValueError naming the field otherwise)."""
    world = WORLDS.get(info.get("world"))
    if world is None:
        raise ValueError(f"info.world is {info.get('world')!r}, not one of {', '.join(sorted(WORLDS))}")
    options = info.get("options", {})
    if not isinstance(options, dict) or set(options) - OPTIONS:
        raise ValueError(f"info.options {options!r} holds other keys than {sorted(OPTIONS)}")
    for key, (low, high) in LIMITS.items():
        value = options.get(key, info.get(key, low))
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"info.{key} is {value!r}, not a whole number in {low}..{high}")
    if options.get("map_name", "4x4") not in ("4x4", "8x8"):
        raise ValueError(f"info.options.map_name is {options['map_name']!r}, not '4x4' or '8x8'")
    return world


def replay(world: World, info: dict[str, Any], actions: list[int]) -> tuple[Any, float, bool, float]:
    """The env after `actions`: (env, the last Gymnasium reward, whether the world ended, Gymnasium's return)."""
    env = world.make(info["options"], info["seed"])
    reward, done, total = 0.0, False, 0.0
    for action in actions:
        _, reward, done, _, _ = env.step(action)
        total += float(reward)
    return env, float(reward), bool(done), total


def show(world: World, env: Any) -> str:
    return f"{world.render(env)}\n\nYour moves: {SEPARATOR.join(world.actions)}"


def parse_move(world: World, action: str) -> int | None:
    """The action the reply names: the last move word in its last <move> tag, else in the whole reply (case is
    ignored: 'I will <move>Hit</move>', 'hit', 'Then I stick.'); None when it names none."""
    found = _TAG.findall(action)
    words = re.findall(r"[a-z]+", (found[-1] if found else action).lower())
    named = [word for word in words if word in world.actions]
    return world.actions.index(named[-1]) if named else None


def reset(task: Task) -> tuple[dict, str]:
    """The world right after Gymnasium's reset with the row's seed."""
    info = task["info"]
    world = world_of(info)
    return {"actions": [], "invalid": 0, "result": ""}, show(world, replay(world, info, [])[0])


def step(task: Task, state: dict, action: str) -> tuple[dict, str, float, bool]:
    """Replay the world with one more action; the final step earns the world's outcome."""
    info = task["info"]
    if state["result"]:
        return state, "The episode is over.", 0.0, True
    world = world_of(info)
    move = parse_move(world, action)
    if move is None:
        return _invalid(world, info, state, action)
    actions = [*state["actions"], move]
    env, reward, done, _ = replay(world, info, actions)
    outcome = world.outcome(env, reward, done)
    result = "over" if outcome is not None else "limit" if len(actions) >= info["move_limit"] else ""
    new = {"actions": actions, "invalid": state["invalid"], "result": result}
    text = f"You moved {world.actions[move]}.\n{show(world, env)}"
    if result == "over":
        return new, f"{text}\n\nThe episode is over: reward {outcome:g}.", outcome, True
    if result == "limit":
        return new, f"{text}\n\nMove limit reached ({info['move_limit']} moves): the episode stops.", 0.0, True
    return new, text, 0.0, False


def _invalid(world: World, info: dict[str, Any], state: dict, action: str) -> tuple[dict, str, float, bool]:
    """Count a reply that names no move; the `max_invalid`-th forfeits the episode."""
    invalid = state["invalid"] + 1
    why = f"reply with one of {SEPARATOR.join(world.actions)} inside <move></move>"
    if invalid >= info["max_invalid"]:
        return {**state, "invalid": invalid, "result": "forfeit"}, f"No move found: {why}. Too many invalid " \
                                                                   f"replies: the episode is lost.", 0.0, True
    left = info["max_invalid"] - invalid
    return {**state, "invalid": invalid}, (f"No move found: {why}. {left} more invalid "
                                           f"{'reply ends' if left == 1 else 'replies end'} the episode."), 0.0, False


def final_state(task: Task, completion: list[Message]) -> dict:
    """The state after the trajectory's actions, stopping where the episode ended (as the rollout loop does)."""
    state = _final_state(json.dumps(task["info"], sort_keys=True), tuple(actions_of(completion)))
    return {**state, "actions": list(state["actions"])}


@lru_cache(maxsize=64)
def _final_state(info_json: str, actions: tuple[str, ...]) -> dict:
    task = {"info": json.loads(info_json)}
    state, _ = reset(task)
    for action in actions:
        if state["result"]:
            break
        state = step(task, state, action)[0]
    return state


def gym_return(task: Task, completion: list[Message]) -> float:
    """Gymnasium's own return of the episode (a metric, weight 0): -1 a move in Taxi, -100 a fall in Cliff Walking."""
    info = task["info"]
    return replay(world_of(info), info, final_state(task, completion)["actions"])[3]


def invalid_moves(task: Task, completion: list[Message]) -> float:
    """How many replies named no move (a metric, weight 0)."""
    return float(final_state(task, completion)["invalid"])


REWARDS = {gym_return: 0.0, invalid_moves: 0.0}
REWARD_RANGE = (0.0, 1.0)
SUCCESS_THRESHOLD = 1.0
