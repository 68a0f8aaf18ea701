"""Per-task difficulty across rollout runs, stored as a mergeable dataset, and sampling by difficulty.

    from hubgym.stats import DifficultyBand, TaskStats, load_stats, push_stats, write_stats

    stats = TaskStats.from_rollouts(["runs/r1", "org/rollouts:r2"])     # exact counts per (env, task, run)
    stats = load_stats(["me/task-stats", "runs/r3"])                   # stored stats + new runs, merged
    write_stats(stats, "stats/"); push_stats(stats, "me/task-stats")   # Parquet + stats.json, atomic / one commit
    stats.tasks(), stats.summary()                                      # polars frames: per task, per env

    band = DifficultyBand.from_sources(["me/task-stats"], low=0.1, high=0.9, min_samples=8)
    band.keep("arithmetic", task_id); band.update(scored_rows)

The command is `hubgym stats SOURCES... [--merge STATS] [--out DIR] [--push REPO]` (hubgym.cli.stats).
"""

from hubgym.stats.band import DifficultyBand
from hubgym.stats.store import (
    STATS_SCHEMA_VERSION, StatsPush, load_stats, open_stats, push_stats, read_stats, write_stats,
)
from hubgym.stats.table import TaskStats, check_tasks

__all__ = ["STATS_SCHEMA_VERSION", "DifficultyBand", "StatsPush", "TaskStats", "check_tasks", "load_stats",
           "open_stats", "push_stats", "read_stats", "write_stats"]
