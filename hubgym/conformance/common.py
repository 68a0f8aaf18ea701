"""What the conformance checks share: how they fail, how they quote values, how they call env code (and watch the
process's global random generators while it runs)."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from hubgym.errors import EnvContractError, Where
from hubgym.schemas import Message, Task
from hubgym.verifiers.contract import Score, Verifier

TOL = 1e-6  # golden rewards and replayed step rewards must agree this closely
SEEDED_FIX = ("make it a function of its inputs only: derive randomness from the task (e.g. "
              "random.Random(task['info']['seed'])) and keep no module-level mutable state")
CLOCK_FIX = ("take dates from the config or from random.Random(seed), never from date.today(), datetime.now() or "
             "time.time(); run a wrapped generator that reads the clock under "
             "hubgym.builders.clock.at_clock(PINNED_CLOCK)")
SCORE_CLOCK_FIX = ("score from the task and the completion only; put any date a reward needs into the row's info when "
                   "the builder makes it")


def fail(what: str, where: Where, fix: str) -> NoReturn:
    raise EnvContractError(what, where, fix)


def short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def guarded(fn: Callable[[], Any], where: Where, doing: str) -> Any:
    """`fn()`; an exception from env code fails the check, saying what was being done."""
    try:
        return fn()
    except EnvContractError:
        raise
    except Exception as exc:
        fail(f"{doing} raised {type(exc).__name__}: {exc}", where,
             "answer any action (invalid, empty, after the end) with an observation and a reward; do not raise")


def same_score(a: Score, b: Score) -> bool:
    """Two scorings agree: the same reward, components and error (two errors of the same type agree)."""
    if a.error is not None and b.error is not None:
        return a.error["type"] == b.error["type"]
    return (a.reward, a.components, a.error) == (b.reward, b.components, b.error)


def score_summary(score: Score) -> str:
    """A score as a failure message quotes it: "reward 0.5 {'correct': 0.5}" or "an error (KeyError)"."""
    if score.error is not None:
        return f"an error ({score.error['type']})"
    return f"reward {score.reward!r} {score.components}"


class CheckSkipped(EnvContractError):
    """A check could not run: something it needs failed in an earlier check (which holds the cause), or
    cannot be had here (a builder class that a second process cannot import)."""

    needs: str | None = None
    owner: str | None = None

    @classmethod
    def because(cls, needs: str, owner: str, where: Where, check: str) -> CheckSkipped:
        skipped = cls(f"skipped: needs {needs}, which failed in {owner}", where, f"fix the {owner} failure first",
                      check=check)
        skipped.needs, skipped.owner = needs, owner
        return skipped


@dataclass(frozen=True)
class Sample:
    """One trajectory the checker scores: a built row with a synthetic reply, or a golden case."""

    config: str | None
    split: str | None
    task: Task
    label: str  # how messages name it: "the empty reply", "golden case 'draw'"
    completion: list[Message] | None = None
    actions: list[str] | None = None  # multi_turn golden cases: replayed through reset/step first


def score_with(verifier: Verifier, sample: Sample) -> Score:
    """Score one sample outside the purity guard (golden actions replayed first); an exception is an error score."""
    try:
        completion = sample.completion
        if sample.actions is not None:
            completion = verifier.run_episode(sample.task, sample.actions).completion()
        return verifier.score(sample.task, completion or [])
    except Exception as exc:  # reset/step of a golden replay raised: data, like Verifier.score does
        return Score(None, {}, {"boundary": "verifier", "type": type(exc).__name__, "message": str(exc)[:2000]})


def global_random_state() -> tuple[Any, Any]:
    """The state of the random module's generator and of numpy's global one (None when numpy is not imported)."""
    numpy = sys.modules.get("numpy")
    return random.getstate(), numpy.random.get_state(legacy=False) if numpy is not None else None


def generator_moved(before: tuple[Any, Any], after: tuple[Any, Any]) -> str | None:
    """Which global generator moved between two states: 'random' or 'numpy.random', or None."""
    if before[0] != after[0]:
        return "random"
    if before[1] is not None and after[1] is not None and _numpy_state_key(before[1]) != _numpy_state_key(after[1]):
        return "numpy.random"
    return None


def _numpy_state_key(state: dict[str, Any]) -> tuple:
    inner = state["state"]
    return state["bit_generator"], tuple(inner["key"].tolist()), inner["pos"], state["has_gauss"], state["gauss"]
