"""Score a batch of trajectories: what `Verifier.score_batch` runs (and `Verifier.score`, a batch of one).

Stages, each given only the rows no earlier stage failed; a row's first error is its error, and the
components computed before it stay on the row, as they do when the row is scored alone:

1. per row: `parse_answer` (component "answer_found"), then each REWARDS function;
2. per batch: each BATCH_REWARDS function, called once with every row still standing. A call that raises,
   or returns anything but one value per row, is split in halves and each half called again, down to
   single rows: the failure lands on the rows that cause it, and a row's result never depends on the rows
   batched with it (the rollout loop scores a group's samples together, a re-score its record batches:
   both must give what scoring the row alone gives). A value that is not a finite number fails its row;
3. per row: the multi_turn episode's summed step rewards ("steps"), then tool-call shaping ("tool_calls").

A row played through the tool `act` (TRL's environment interface) is scored on the trajectory its env saw
(hubgym.verifiers.act): every stage reads that, as they read a row of hubgym's own loop.

The total adds weight x value in that order and is rounded by `exact`, so a batch gives, float for float,
what its rows give one at a time.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from hubgym.schemas.messages import Message
from hubgym.schemas.rollouts import RowError
from hubgym.schemas.tasks import Task
from hubgym.verifiers.act import driven_by_act, env_view
from hubgym.verifiers.rewards import tool_call_reward

BatchRewardFn = Callable[[list[Task], list[list[Message]]], Sequence[float]]
ANSWER_FOUND = "answer_found"  # reserved component: weight 0, set from parse_answer
STEPS = "steps"  # reserved component: a multi_turn episode's summed step rewards, weight 1
TOOL_CALLS = "tool_calls"  # reserved component: per-call tool shaping, weight 1
RESERVED = (ANSWER_FOUND, STEPS, TOOL_CALLS)


class Verifier(Protocol):
    """What scoring reads of a loaded verifier (hubgym.verifiers.contract.Verifier)."""

    rewards: dict[str, tuple[Callable[[Task, list[Message]], float], float]]
    batch_rewards: dict[str, tuple[BatchRewardFn, float]]
    weights: dict[str, float]
    parse_answer: Callable[[Task, list[Message]], str | None] | None
    source_path: Path
    reset: Callable[[Task], tuple[Any, str]] | None
    step: Callable[[Task, Any, str], tuple[Any, str, float, bool]] | None

    @property
    def multi_turn(self) -> bool: ...

    def run_episode(self, task: Task, actions: list[str]) -> Any: ...


@dataclass(frozen=True)
class Score:
    """The result of scoring one trajectory. `reward` is None exactly when `error` is set."""

    reward: float | None
    components: dict[str, float]
    error: RowError | None = None


def actions_of(completion: list[Message]) -> list[str]:
    """Environment actions: assistant turns that are not tool calls, in order."""
    return [m["content"] or "" for m in completion if m["role"] == "assistant" and not m.get("tool_calls")]


def score_rows(verifier: Verifier, tasks: Sequence[Task], completions: Sequence[list[Message]],
               cuts: Sequence[bool] | None = None) -> list[Score]:
    """The Score of each (task, completion, cut) row; see the module docstring for the stages."""
    rows = len(tasks)
    if len(completions) != rows or (cuts is not None and len(cuts) != rows):
        raise ValueError(f"score_batch got {rows} tasks, {len(completions)} completions and "
                         f"{'no' if cuts is None else len(cuts)} cut flags; give one of each per row")
    components: list[dict[str, float]] = [{} for _ in range(rows)]
    errors: list[RowError | None] = [None] * rows
    if verifier.multi_turn and any(driven_by_act(t["interaction"]) for t in tasks):
        completions, cuts = _act_views(verifier, tasks, completions, cuts, errors)
    if verifier.parse_answer is not None or verifier.rewards:
        _per_row_rewards(verifier, tasks, completions, components, errors)
    for name, (fn, _) in verifier.batch_rewards.items():
        _batch_reward(verifier, name, fn, tasks, completions, components, errors)
    _episode_and_shaping(verifier, tasks, completions, cuts, components, errors)
    return [Score(None, row, error) if error is not None else Score(exact(_total(verifier.weights, row)), row)
            for row, error in zip(components, errors)]


def _act_views(verifier: Verifier, tasks: Sequence[Task], completions: Sequence[list[Message]],
               cuts: Sequence[bool] | None, errors: list[RowError | None]) -> tuple[list, list[bool]]:
    """Rows played through `act` (TRL's environment interface) are scored on the trajectory their env saw
    (hubgym.verifiers.act.env_view), never cut: a reply cut short there is text, which is no action anyway."""
    views, flags = list(completions), list(cuts) if cuts is not None else [False] * len(tasks)
    for i, task in enumerate(tasks):
        if driven_by_act(task["interaction"]):
            flags[i] = False
            try:
                views[i] = env_view(verifier, task, completions[i])
            except Exception as exc:  # the env's step raised on a stored action: the row's error, never a reward
                errors[i] = verifier_error(exc, verifier.source_path)
    return views, flags


def _total(weights: dict[str, float], row: dict[str, float]) -> float:
    """weight x value of each reward, then the step rewards and the tool shaping, added in that order."""
    total = 0.0
    for name, weight in weights.items():
        total += weight * row[name]
    if STEPS in row:
        total += row[STEPS]
    if TOOL_CALLS in row:
        total += row[TOOL_CALLS]
    return total


def exact(value: float) -> float:
    """A sum of float rewards as its terms mean it: 0.1 + 0.2 is 0.3, not 0.30000000000000004 (12 decimals kept)."""
    return round(value, 12) + 0.0  # + 0.0: never -0.0


def _per_row_rewards(verifier: Verifier, tasks: Sequence[Task], completions: Sequence[list[Message]],
                     components: list[dict[str, float]], errors: list[RowError | None]) -> None:
    parse, rewards = verifier.parse_answer, list(verifier.rewards.items())
    for i, (task, completion) in enumerate(zip(tasks, completions)):
        row = components[i]
        if errors[i] is not None:
            continue
        try:
            if parse is not None:  # first, so a reward that raises still leaves it on the row
                row[ANSWER_FOUND] = answer_found(parse(task, completion))
            for name, (fn, _) in rewards:
                row[name] = as_reward(fn(task, completion), name)
        except Exception as exc:  # a bad rollout is data, not a crash
            errors[i] = verifier_error(exc, verifier.source_path)


def _batch_reward(verifier: Verifier, name: str, fn: BatchRewardFn, tasks: Sequence[Task],
                  completions: Sequence[list[Message]], components: list[dict[str, float]],
                  errors: list[RowError | None]) -> None:
    live = [i for i, error in enumerate(errors) if error is None]
    if not live:
        return
    if len(live) == len(tasks):
        values = batch_values(fn, name, list(tasks), list(completions), verifier.source_path)
    else:
        values = batch_values(fn, name, [tasks[i] for i in live], [completions[i] for i in live],
                              verifier.source_path)
    for i, value in zip(live, values):
        if type(value) is float:
            components[i][name] = value
        else:
            errors[i] = value


def batch_values(fn: BatchRewardFn, name: str, tasks: list[Task], completions: list[list[Message]],
                 source: Path) -> list[float | RowError]:
    """One batch reward's value (or verifier error) per row: a failed call is split in halves, down to single
    rows, so only the rows that make it fail get its error."""
    try:
        values = fn(tasks, completions)
        _check_shape(values, len(tasks), name)
    except Exception as exc:
        if len(tasks) == 1:
            return [verifier_error(exc, source)]
        half = len(tasks) // 2
        return (batch_values(fn, name, tasks[:half], completions[:half], source)
                + batch_values(fn, name, tasks[half:], completions[half:], source))
    if set(map(type, values)) == {float} and all(map(math.isfinite, values)):
        return list(values)  # the common case, checked in C: finite floats
    out: list[float | RowError] = []
    for value in values:
        try:
            out.append(as_reward(value, name))
        except TypeError as exc:
            out.append(verifier_error(exc, source))
    return out


def _check_shape(values: Any, rows: int, name: str) -> None:
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"batch reward function {name!r} returned {type(values).__name__}; it must return a list "
                        f"of floats, one per row")
    if len(values) != rows:
        raise ValueError(f"batch reward function {name!r} returned {len(values)} value(s) for {rows} row(s); it "
                         f"must return one float per row, in the order of the rows")


def _episode_and_shaping(verifier: Verifier, tasks: Sequence[Task], completions: Sequence[list[Message]],
                         cuts: Sequence[bool] | None, components: list[dict[str, float]],
                         errors: list[RowError | None]) -> None:
    for i, (task, completion) in enumerate(zip(tasks, completions)):
        if errors[i] is not None:
            continue
        try:
            if verifier.multi_turn:
                actions = actions_of(completion)[:-1] if cuts is not None and cuts[i] else actions_of(completion)
                components[i][STEPS] = sum(s.reward for s in verifier.run_episode(task, actions).steps)
            if task["interaction"]["tool_rewards"]:
                components[i][TOOL_CALLS] = exact(tool_call_reward(task, completion))
        except Exception as exc:  # a bad rollout is data, not a crash
            errors[i] = verifier_error(exc, verifier.source_path)


def as_reward(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"reward function {name!r} returned {value!r}; it must return a finite float")
    return float(value)


def answer_found(answer: Any) -> float:
    if answer is not None and not isinstance(answer, str):
        raise TypeError(f"parse_answer returned {answer!r}; it must return the answer text or None")
    return float(bool(answer and answer.strip()))


def verifier_error(exc: BaseException, source: Path) -> RowError:
    """The row's error: the exception's type and message, and the verifier line it was raised at."""
    return {"boundary": "verifier", "type": type(exc).__name__, "message": str(exc)[:1900] + raised_at(exc, source)}


def raised_at(exc: BaseException, source: Path) -> str:
    """' (at verifier.py:12 in correct)': the last line of the verifier module the exception passed through, so a
    stored error says which line of which function to read ('' when it never passed through the module)."""
    mine = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(source)]
    if not mine:
        return ""
    return f" (at {Path(mine[-1].filename).name}:{mine[-1].lineno} in {mine[-1].name})"
