"""The multi_turn checks: reset/step replay deterministically, and golden episodes replay and re-score.

Hidden state is what they look for: anything reset or step keep outside the `state` they return
(a module-level counter, a cache that changes its answers, an unseeded generator, the clock).
The episodes are first run on a freshly imported copy of the verifier module, then run again
until at least STEP_CALLS more steps were taken, and every run must match the first; so state
that changes only after a few calls shows, and a stored rollout replays the same anywhere. A step
must also leave the state it is given as it was: the samples of a group share reset's state.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import sys
from typing import TYPE_CHECKING, Any, Iterator

from hubgym.conformance.common import SEEDED_FIX, TOL, fail, guarded, short
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import Task
from hubgym.verifiers.contract import Verifier, actions_of

if TYPE_CHECKING:
    from hubgym.conformance.context import Context

REPLAY_ROWS = 3  # built rows per split that the reset/step check also replays the golden actions on
STEP_CALLS = 200  # the episodes run again until at least this many more steps were taken on the fresh copy
_FIELDS = ("observation", "reward", "done", "state")


def check_reset_step_deterministic(ctx: Context) -> None:
    """Every episode, run again and again (at least STEP_CALLS more steps), and then on another freshly imported
    verifier in the reverse order, gives the observations, rewards, done flags and JSON states it gave on a freshly
    imported verifier."""
    if not ctx.verifier.multi_turn:
        return
    fresh = guarded(lambda: fresh_copy(ctx.verifier), ctx.where(field="VERIFIER"), "importing the verifier again")
    replays, steps = list(_replays(ctx)), 0
    firsts = []
    for task, actions, label, where in replays:
        firsts.append((_trace(fresh, task, actions, label, where), steps))
        steps += len(firsts[-1][0]) - 1
    taken = steps
    while steps - taken < STEP_CALLS:
        before = steps
        for (task, actions, label, where), (first, at) in zip(replays, firsts):
            again = _trace(fresh, task, actions, label, where)
            _compare(first, again, label, where, steps - at - (len(first) - 1))
            steps += len(again) - 1
        if steps == before:  # no episode takes a step: nothing more to learn by repeating
            break
    _check_order(ctx, replays, [first for first, _ in firsts])  # last: state that drifts by itself is named first


def _compare(first: list[dict[str, Any]], again: list[dict[str, Any]], label: str, where: Where, between: int) -> None:
    for i, (a, b) in enumerate(zip(first, again)):
        for field in _FIELDS:
            if a[field] != b[field]:
                at = "after reset" if i == 0 else f"at step {i}"
                fail(f"running {label} again gave different {field}s {at} ({short(a[field])} on a freshly imported "
                     f"verifier, then {short(b[field])} after {between} other steps); most likely reset or step uses "
                     f"an unseeded random generator, the clock, or state kept outside `state` (a module-level "
                     f"variable that changes as it is called)", where, SEEDED_FIX)


def _check_order(ctx: Context, replays: list, firsts: list[list[dict[str, Any]]]) -> None:
    """The episodes run on another freshly imported verifier in the reverse order give what they gave first: a cache
    of observations keyed on too little (two tasks at one position share an answer) answers the task that came first."""
    other = guarded(lambda: fresh_copy(ctx.verifier), ctx.where(field="VERIFIER"), "importing the verifier again")
    for (task, actions, label, where), first in reversed(list(zip(replays, firsts))):
        again = _trace(other, task, actions, label, where)
        for i, (a, b) in enumerate(zip(first, again)):
            field = next((f for f in _FIELDS if a[f] != b[f]), None)
            if field is not None:
                at = "after reset" if i == 0 else f"at step {i}"
                fail(f"running {label} on a fresh verifier after the other episodes, in the reverse order, gave "
                     f"different {field}s {at} ({short(a[field])} in the first order, then {short(b[field])}); most "
                     f"likely reset or step caches answers under a key that leaves out part of the task or state, so "
                     f"two tasks at one position get one answer", where,
                     "key any cache on everything the answer depends on (the whole task info and state), or drop it")


def fresh_copy(verifier: Verifier) -> Verifier:
    """The verifier's module imported once more, as a separate module: its module-level state as right after import.

    The copy is not left in sys.modules; relative imports resolve in the original's package.
    """
    module, path = verifier.module, verifier.source_path
    if not path.is_file():  # no source to import again (a module built in memory): check the loaded one
        return verifier
    name = f"{module.__name__}__hubgym_fresh_copy"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return verifier
    copy = importlib.util.module_from_spec(spec)
    copy.__package__ = module.__package__
    sys.modules[name] = copy  # some module code (dataclasses, pickling) looks itself up while it runs
    try:
        spec.loader.exec_module(copy)
    finally:
        del sys.modules[name]
    return Verifier(copy, verifier.env)


def _replays(ctx: Context) -> Iterator[tuple[Task, list[str], str, Where]]:
    """(task, actions, label, where): the golden episodes, then golden and synthetic actions on a few built rows."""
    from hubgym.conformance.context import GENERIC_REPLY

    sequences = [("the actions '' and a generic reply", ["", GENERIC_REPLY])]
    try:
        golden = ctx.golden
    except EnvContractError:  # reported by check_golden_cases; the synthetic actions still run
        golden = []
    for case in golden:
        actions = case.actions if case.actions is not None else actions_of(case.completion or [])
        sequences.append((f"the actions of golden case {case.name!r}", actions))
        yield case.task, actions, f"golden case {case.name!r}", ctx.where(field="GOLDEN")
    for config, split, rows in ctx.splits():
        for row in rows[:REPLAY_ROWS]:
            for label, actions in sequences:
                yield row, actions, label, ctx.where(config, split, row["id"], "step")


def _trace(verifier: Verifier, task: Task, actions: list[str], label: str, where: Where) -> list[dict[str, Any]]:
    """[reset, step 1, ...] as dicts of observation, reward, done, state; checks types and JSON states on the way."""
    state, observation = _returned(guarded(lambda: verifier.reset(task), where, f"reset for {label}"),
                                   "(state, observation)", f"reset for {label}", where)
    trace = [{"observation": observation, "reward": 0.0, "done": False, "state": state}]
    for i, action in enumerate(actions, start=1):
        given, unchanged = state, copy.deepcopy(state)
        state, observation, reward, done = _returned(
            guarded(lambda: verifier.step(task, state, action), where, f"step {i} of {label}"),
            "(state, observation, reward, done)", f"step {i} of {label}", where)
        if given != unchanged:
            fail(f"step {i} of {label} changed the state it was given ({short(unchanged)} became {short(given)}); the "
                 f"samples of a group all start from the one state reset returned, so one sample's step would change "
                 f"the others' episodes", where,
                 "return a new state from step (e.g. {**state, 'guesses': state['guesses'] + 1}); never change the "
                 "one it receives")
        trace.append({"observation": observation, "reward": reward, "done": bool(done), "state": copy.deepcopy(state)})
        if done:
            break
    for i, step in enumerate(trace):
        at = "reset" if i == 0 else f"step {i}"
        _check_step_values(step, f"{at} of {label}", where)
    return trace


def _returned(value: Any, shape: str, at: str, where: Where) -> tuple:
    if not isinstance(value, tuple) or len(value) != shape.count(",") + 1:
        fail(f"{at} returned {short(value)}, not a tuple {shape}", where, f"return {shape}")
    return value


def _check_step_values(step: dict[str, Any], at: str, where: Where) -> None:
    if not isinstance(step["observation"], str):
        fail(f"{at} returned an observation of type {type(step['observation']).__name__}", where,
             "return the observation as a string (the text the model sees next)")
    reward = step["reward"]
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        fail(f"{at} returned reward {reward!r}", where, "return a finite float reward from step")
    try:
        json.dumps(step["state"], allow_nan=False)
    except (TypeError, ValueError) as exc:
        fail(f"the state after {at} is not JSON-serializable ({exc})", where,
             "keep state as dicts, lists, strings, numbers, booleans and None, so episodes can be stored and resumed")


def check_golden_replay(ctx: Context) -> None:
    """A golden episode's completion re-scores to the episode's step rewards and replays to the same observations."""
    verifier = ctx.verifier
    if not verifier.multi_turn:
        return
    where = ctx.where(field="GOLDEN")
    for case in ctx.golden:
        label = f"golden case {case.name!r}"
        if case.actions is None:
            _check_stored_observations(verifier, case.task, case.completion or [], label, where)
            continue
        episode = guarded(lambda: verifier.run_episode(case.task, case.actions), where, f"replaying {label}")
        completion = episode.completion()
        replay = guarded(lambda: verifier.run_episode(case.task, actions_of(completion)), where,
                         f"replaying the completion of {label}")
        for i, (a, b) in enumerate(zip(episode.steps, replay.steps), start=1):
            if (a.observation, a.reward, a.done) != (b.observation, b.reward, b.done):
                fail(f"replaying the completion of {label} does not reproduce step {i}: {short(a.observation)} "
                     f"(reward {a.reward!r}) then {short(b.observation)} (reward {b.reward!r}); most likely step "
                     f"depends on something the completion does not record", where, SEEDED_FIX)
        earned = sum(s.reward for s in episode.steps)
        score = verifier.score(case.task, completion)
        rescored = score.components.get("steps")
        if rescored is None or abs(rescored - earned) > TOL:
            fail(f"re-scoring the completion of {label} gives step rewards {rescored!r}, but the episode earned "
                 f"{earned!r}", where, "make step depend only on (task, state, action)")


def _check_stored_observations(verifier: Verifier, task: Task, completion: list, label: str, where: Where) -> None:
    """A golden completion that stores observations (user turns) must match what replaying its actions shows."""
    stored = [m["content"] for m in completion if m["role"] == "user"]
    if not stored:
        return
    replay = guarded(lambda: verifier.run_episode(task, actions_of(completion)), where, f"replaying {label}")
    shown = [s.observation for s in replay.steps if s.observation]
    for i, observation in enumerate(stored):
        if i >= len(shown) or shown[i] != observation:
            fail(f"{label} stores observation {i + 1} as {short(observation)}, but replaying its actions shows "
                 f"{short(shown[i]) if i < len(shown) else 'nothing'}", where,
                 "update the case's completion (or give actions instead), or make step deterministic")
