"""Sampling by difficulty: keep the tasks whose pass rate lies in a band, from stored stats and the policy's own
rollouts.

    band = DifficultyBand.from_sources(["me/task-stats"], low=0.1, high=0.9, min_samples=8)
    tasks = [t for t in drawn if band.keep(t["env"], t["id"])]      # per drawn task
    band.update(step_rows)                                         # each finished step's scored rows

GRPO learns only from groups whose rewards differ; a task the policy always or never solves gives a group
with zero advantage. Tasks with no stats yet, or fewer than `min_samples` scored samples, are kept
(explore); a task whose pass rate is below `low` or above `high` is skipped. `update` adds the policy's
rollouts to the counts, so a task leaves the band when the policy masters it, and comes back when its rate
moves in again. With `decay` < 1, a task's earlier counts are multiplied by `decay` each time new rows of it
arrive, so recent rollouts weigh more than old stored ones (its samples then shrink too, and a task whose
decayed count falls under `min_samples` is explored again).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hubgym.stats.table import TaskStats, frame_of_dicts, parts_of_rows


class DifficultyBand:
    """Pass-rate band over (env, task_id); see the module docstring."""

    def __init__(self, stats: TaskStats | None, low: float, high: float, *, min_samples: int = 8,
                 decay: float = 1.0, thresholds: Mapping[str, float] | None = None):
        _check_band(low, high, min_samples, decay)
        self.low, self.high, self.min_samples, self.decay = float(low), float(high), min_samples, float(decay)
        self.thresholds = dict(thresholds or {})
        self._counts: dict[tuple[str, str], list[float]] = {}  # (env, task_id) -> [samples, passes]
        self._runs: dict[tuple[str, str], frozenset[str]] = {}  # runs already counted from stored stats
        self._seen: set[str] = set()  # rollout ids added by update()
        tasks = (stats or TaskStats()).tasks()
        for env, task_id, samples, passes, runs in tasks.select("env", "task_id", "samples", "passes",
                                                                "runs").iter_rows():
            self._counts[(env, task_id)] = [float(samples), float(passes)]
            self._runs[(env, task_id)] = frozenset(runs)

    @classmethod
    def from_sources(cls, sources: str | Sequence[str], low: float, high: float, min_samples: int = 8,
                     hub: Any = None, *, decay: float = 1.0,
                     thresholds: Mapping[str, float] | None = None) -> "DifficultyBand":
        """A band started from stored stats: stats folders or repos (`hubgym stats --out/--push`), and rollout
        run folders or repos, merged."""
        from hubgym.stats.store import load_stats

        stats = load_stats(sources, hub=hub, thresholds=thresholds) if sources else TaskStats()
        return cls(stats, low, high, min_samples=min_samples, decay=decay, thresholds=thresholds)

    def pass_rate(self, env: str, task_id: str) -> float | None:
        """The task's current pass rate; None while it has fewer than `min_samples` samples (or none)."""
        samples, passes = self._counts.get((env, task_id), (0.0, 0.0))
        if samples <= 0 or samples < self.min_samples:
            return None
        return passes / samples

    def keep(self, env: str, task_id: str) -> bool:
        """Whether to train on this task now: unknown tasks yes, known ones when low <= pass rate <= high."""
        rate = self.pass_rate(env, task_id)
        return rate is None or self.low <= rate <= self.high

    def update(self, rows: list[dict]) -> None:
        """Add the policy's scored rollout rows. Rows already counted (the same rollout id, or a run the stored
        stats hold for that task) are not counted again; rows without a reward (failed) add nothing. A row
        missing env, task_id, run_id, rollout_id or reward is an EnvContractError naming it."""
        fresh = [r for r in rows if r.get("rollout_id") not in self._seen]
        frame = frame_of_dicts(fresh)  # validates every row before any count moves
        parts = parts_of_rows(frame, self.thresholds)
        for env, task_id, run_id, samples, passes in parts.select("env", "task_id", "run_id", "samples",
                                                                  "passes").iter_rows():
            if run_id in self._runs.get((env, task_id), ()):
                continue
            counts = self._counts.setdefault((env, task_id), [0.0, 0.0])
            counts[0] = counts[0] * self.decay + samples
            counts[1] = counts[1] * self.decay + passes
        self._seen.update(frame["rollout_id"].to_list())

    def __len__(self) -> int:
        return len(self._counts)

    def __repr__(self) -> str:
        return (f"DifficultyBand(low={self.low}, high={self.high}, min_samples={self.min_samples}, "
                f"decay={self.decay}, tasks={len(self)})")


def _check_band(low: float, high: float, min_samples: int, decay: float) -> None:
    """One message per broken invariant: the value, the rule and the fix."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"DifficultyBand low={low}, high={high}: need 0 <= low <= high <= 1 (pass rates); e.g. "
                         f"low=0.1, high=0.9 keeps tasks the policy solves sometimes but not always")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 0:
        raise ValueError(f"DifficultyBand min_samples={min_samples!r}: need a whole number >= 0 (samples a task needs "
                         f"before its pass rate is trusted); e.g. the group size n")
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"DifficultyBand decay={decay}: need 0 < decay <= 1 (1 keeps every count; 0.5 halves a "
                         f"task's earlier counts each time new rows of it arrive)")
