"""Verifier for the `ta_*` envs: single-player TextArena games, replayed from their seed.

    from hubgym.bridges.textarena_verifier import reset, step
    task = {"info": {"game": "tower_of_hanoi", "options": {"num_disks": 3, "max_turns": 14}, "seed": 7,
                     "max_invalid": 3}}
    state, board = reset(task)
    state, observation, reward, done = step(task, state, "[A C]")

State (JSON): {"seed": int, "actions": [str], "invalid": int, "result": str} -- the game's seed, every
action given so far (invalid ones included), how many were invalid moves, and "" while the game runs,
else "solved", "over" (the game ended without a win: a turn limit, a hole) or "forfeit" (`info.max_invalid`
invalid moves).

TextArena's games keep their position in a live Python object, so `step` rebuilds it every time: a new
engine, `reset` with the seed, every stored action replayed, then the new one. The engines draw from
Python's global `random` (seeded by TextArena's `State`); while one replays, the `random` its modules see
is a private `random.Random`, so replays neither read nor change the process's global generator, and a
lock keeps two threads' replays apart. The opening (the engine right after reset) is memoized and copied,
never stepped itself, so each step pays for its moves but not for building the board again. A step is
O(actions so far); `hubgym/bridges/textarena.py` records what that costs at each game's longest episode.

Invalid moves: TextArena's own limit (a second invalid move in a row ends the game) is lifted; an invalid
move is answered with TextArena's reason plus the count, uses up a turn of `max_turns`, and the
`max_invalid`-th one forfeits the game.

Reward: the final step earns TextArena's reward: 1.0 when the puzzle is solved, else the game's own
completion share in [0, 1] when it ends otherwise (disks placed, lights off, pegs right, cells filled,
closeness of the last guess, the way to the goal before a fall into a hole); a forfeit earns 0.0, as does
every other step. Metrics (weight 0): solved, invalid_moves.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import random
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Iterator

from hubgym.schemas import Message, Task
from hubgym.verifiers.contract import actions_of

ENGINES: dict[str, str] = {
    "frozen_lake": "textarena.envs.FrozenLake.env:FrozenLakeEnv",
    "guess_the_number": "textarena.envs.GuessTheNumber.env:GuessTheNumberEnv",
    "lights_out": "textarena.envs.LightsOut.env:LightsOutEnv",
    "mastermind": "textarena.envs.Mastermind.env:MastermindEnv",
    "sudoku": "textarena.envs.Sudoku.env:SudokuEnv",
    "tower_of_hanoi": "textarena.envs.TowerOfHanoi.env:TowerOfHanoiEnv",
}
"""The games this verifier runs, by the name rows give in `info.game`. Stored data never chooses code: a
name outside this table is refused."""
NO_LIMIT = 1 << 30  # TextArena's error allowance while hubgym counts invalid moves itself
OUTCOME_TEXT = {"solved": "Solved!", "over": "Game over."}
_REPLAY_LOCK = threading.Lock()  # the private generator is swapped into shared modules: one replay at a time


@dataclass(frozen=True)
class Replay:
    """What one call of a replay showed: reset's opening, or one action's answer."""

    observation: str
    done: bool  # the game ended by its own rules (solved, or its turn limit)
    reward: float  # TextArena's reward when done, else 0.0
    invalid: bool  # the action was an invalid move


@cache
def engine_class(game: str) -> type:
    """The TextArena env class of a game named in ENGINES (imported on first use)."""
    if game not in ENGINES:
        raise ValueError(f"info.game is {game!r}, not one of {', '.join(sorted(ENGINES))}")
    module, _, name = ENGINES[game].partition(":")
    return getattr(importlib.import_module(module), name)


def check_options(game: str, options: dict[str, Any]) -> None:
    """Options must be arguments of the game's constructor, with JSON scalar values."""
    allowed = set(inspect.signature(engine_class(game).__init__).parameters) - {"self"}
    for key, value in sorted(options.items()):
        if key not in allowed:
            raise ValueError(f"info.options has {key!r}, not an argument of {game!r} ({', '.join(sorted(allowed))})")
        if not isinstance(value, (int, float, str, bool)):
            raise ValueError(f"info.options[{key!r}] is {value!r}; options are JSON numbers, strings or booleans")
    if json.dumps(options, sort_keys=True) not in _shipped_options(game):  # rows are untrusted: no unshipped size
        raise ValueError(f"info.options {json.dumps(options, sort_keys=True)[:160]} are not the arguments of any "
                         f"difficulty variant of {game!r} that the textarena family ships")


@cache
def _shipped_options(game: str) -> frozenset[str]:
    """The TextArena arguments of every config the family ships for `game`, as sorted JSON. Cached: TextArena's
    registry is fixed once imported, and walking it for every reset was most of a game's scoring time."""
    from hubgym.bridges.textarena_games import GAMES, variants

    return frozenset(json.dumps(options, sort_keys=True) for spec in GAMES.values() if spec.engine == game
                     for options in variants(spec.textarena_id, spec.skip).values())


@contextmanager
def private_random(game: str) -> Iterator[random.Random]:
    """While a game replays, TextArena's `random` (in its core and the game's module) is a fresh private
    generator; `State.__init__` seeds it with the task's seed. The global generator is never touched."""
    engine = engine_class(game)
    modules = [sys.modules["textarena.core"], sys.modules[engine.__module__]]
    with _REPLAY_LOCK:
        saved = [m.random for m in modules]
        generator = random.Random()
        for m in modules:
            m.random = generator
        try:
            yield generator
        finally:
            for m, original in zip(modules, saved):
                m.random = original


def replay(info: dict[str, Any], seed: int, actions: list[str]) -> list[Replay]:
    """Rebuild the game from its seed and play `actions` in order, in one engine: what reset showed, then what
    each action's call showed. Stops early when the game ends by its own rules."""
    game, options = info["game"], info.get("options") or {}
    check_options(game, options)
    with private_random(game) as generator:
        opened, generator_state, opening = _opening(game, json.dumps(options, sort_keys=True), seed)
        env = copy.deepcopy(opened)  # the cached opening itself is never stepped
        generator.setstate(generator_state)
        shown = [Replay(opening, False, 0.0, False)]
        for action in actions:
            if shown[-1].done:
                break
            errors_before = env.state.error_count
            env.step(action)
            done = bool(env.state.done)
            reward = float(env.state.rewards[0]) if done and env.state.rewards else 0.0
            shown.append(Replay(_drain(env), done, reward, env.state.error_count > errors_before))
    return shown


@lru_cache(maxsize=256)
def _opening(game: str, options: str, seed: int) -> tuple[Any, tuple, str]:
    """(the engine right after reset, the private generator's state then, what reset showed), made under
    `private_random`. A memo of a pure function: building some boards (Sudoku's uniqueness search) costs far
    more than copying them, and every step of an episode starts from the same opening."""
    env = engine_class(game)(**json.loads(options))
    env.reset(num_players=1, seed=seed)
    env.state.error_allowance = NO_LIMIT  # hubgym counts invalid moves itself (see the module docstring)
    return env, sys.modules["textarena.core"].random.getstate(), _drain(env)


def _drain(env: Any) -> str:
    """The messages the game showed the player since the last call, without the echo of the player's own
    action; when the game ended, its reason too (TextArena keeps that outside the messages)."""
    from textarena.core import ObservationType

    _, messages = env.get_observation()
    lines = [text.strip() for _, text, kind in messages if kind != ObservationType.PLAYER_ACTION and text.strip()]
    reason = env.state.game_info[0].get("reason") if env.state.done else None
    if reason:
        lines.append(str(reason).strip())
    return "\n".join(lines)


def reset(task: Task) -> tuple[dict, str]:
    """The game's opening: its rules and, for board games, the board."""
    info = task["info"]
    state = {"seed": int(info["seed"]), "actions": [], "invalid": 0, "result": ""}
    return state, replay(info, state["seed"], [])[0].observation


def step(task: Task, state: dict, action: str) -> tuple[dict, str, float, bool]:
    """Replay the game with one more action; the final step earns the game's reward (a forfeit earns 0)."""
    if state["result"]:
        return state, "The game is over.", 0.0, True
    return advance(task["info"], state, action, replay(task["info"], state["seed"], [*state["actions"], action])[-1])


def advance(info: dict[str, Any], state: dict, action: str, shown: Replay) -> tuple[dict, str, float, bool]:
    """hubgym's rules on top of what the game showed for `action`: invalid moves counted, the last one forfeits."""
    invalid = state["invalid"] + int(shown.invalid)
    text, reward = shown.observation, 0.0
    if shown.done:
        outcome = "solved" if shown.reward >= 1.0 else "over"
        reward = min(max(shown.reward, 0.0), 1.0)
        text += f"\n{OUTCOME_TEXT[outcome]}"
    elif shown.invalid and invalid >= info["max_invalid"]:
        outcome = "forfeit"
        text += f"\nThat was invalid move {invalid} of {info['max_invalid']} allowed: you lose."
    else:
        outcome = ""
        if shown.invalid:
            left = info["max_invalid"] - invalid
            text += f"\nInvalid moves: {invalid}; {left} more {'ends' if left == 1 else 'end'} the game."
    new = {"seed": state["seed"], "actions": [*state["actions"], action], "invalid": invalid, "result": outcome}
    return new, text, reward, bool(outcome)


def final_state(task: Task, completion: list[Message]) -> dict:
    """The state after the trajectory's actions, stopping where the game ended (as the rollout loop does); one
    engine run, where stepping would replay the game once per action. The rewards below share it (a memo)."""
    state = _final_state(json.dumps(task["info"], sort_keys=True), tuple(actions_of(completion)))
    return {**state, "actions": list(state["actions"])}  # a copy: the memo's own is never handed out


@lru_cache(maxsize=64)
def _final_state(info_json: str, actions: tuple[str, ...]) -> dict:
    info = json.loads(info_json)
    state, _ = reset({"info": info})
    for action, shown in zip(actions, replay(info, state["seed"], list(actions))[1:]):
        state = advance(info, state, action, shown)[0]
        if state["result"]:
            break
    return state


def solved(task: Task, completion: list[Message]) -> float:
    """1.0 when the puzzle was solved (a metric: weight 0)."""
    return float(final_state(task, completion)["result"] == "solved")


def invalid_moves(task: Task, completion: list[Message]) -> float:
    """How many actions were invalid moves (a metric: weight 0)."""
    return float(final_state(task, completion)["invalid"])


REWARDS = {solved: 0.0, invalid_moves: 0.0}
REWARD_RANGE = (0.0, 1.0)
SUCCESS_THRESHOLD = 1.0  # only a solved game earns 1.0; a turn limit earns the game's completion share
