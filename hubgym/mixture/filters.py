"""The difficulty hook: a filter the mixture asks before it hands out a task.

    class TaskFilter(Protocol):
        def keep(self, env: str, task_id: str) -> bool: ...   # pure given its current state
        def update(self, rows: list[dict]) -> None: ...       # scored rollout rows of a finished step

`hubgym.stats.DifficultyBand` is the filter training uses (tasks whose pass rate is inside a band); any object
with these two methods works. `KeepAll` is the identity.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["KeepAll", "MAX_REJECTIONS", "TaskFilter"]

MAX_REJECTIONS = 10_000
"""Consecutive rows of one env config a filter may reject before the draw stops with an error: a filter that
rejects everything must end a run with a message, not hang it."""


@runtime_checkable
class TaskFilter(Protocol):
    """Decides which drawn tasks are handed out; learns from the scored rows of each finished step."""

    def keep(self, env: str, task_id: str) -> bool:
        """True to hand the task out. Pure given the filter's current state (no randomness, no clock)."""
        ...

    def update(self, rows: list[dict]) -> None:
        """Take in the scored rollout rows of one finished step (so the filter follows the policy)."""
        ...


class KeepAll:
    """Keeps every task; learns nothing."""

    def keep(self, env: str, task_id: str) -> bool:
        return True

    def update(self, rows: list[dict]) -> None:
        return None
