"""What the conformance checks share: how they fail, how they quote values, how they call env code."""

from __future__ import annotations

from typing import Any, Callable, NoReturn

from hubgym.errors import EnvContractError, Where

TOL = 1e-6  # golden rewards and replayed step rewards must agree this closely
SEEDED_FIX = ("make it a function of its inputs only: derive randomness from the task (e.g. "
              "random.Random(task['info']['seed'])) and keep no module-level mutable state")


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
