"""One progress bar for a run whose workers sample on other machines: workers report, the driver draws.

    board = ray.remote(num_cpus=0)(RunBoard).remote()        # a small actor beside the driver
    listener = BoardListener(board, shard_index=1)           # in a worker: run_rollouts(..., listener=listener)
    with ClusterProgress(workers=4, n=8) as bar:
        bar.show(ray.get(board.snapshot.remote()))           # the driver, every half second

    groups ━━━━━━━━━━ 60/64 rollouts 480/512 · 64 resumed · 0 failed · 51,200 tok · 3,100 tok/s · 4/4 workers started

A worker sends its *totals* (groups done, rollouts, failed rows, tokens), at most every `every_s` seconds: a
lost or repeated report changes nothing, and a restarted worker simply reports again from what it stored, so
the bar never counts a group twice (it may step back by the groups a killed worker had not flushed yet).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RunBoard:
    """What each worker (shard index) last said: where it runs, how often it started, its totals."""

    def __init__(self) -> None:
        self.shards: dict[int, dict[str, Any]] = {}

    def scheduled(self, shard: int, node: str, pid: int) -> None:
        """A worker process took shard `shard` (again, after a restart)."""
        entry = self.shards.setdefault(shard, {"attempts": 0})
        entry.update(attempts=entry["attempts"] + 1, node=node, pid=pid, groups=None, stored=0, done=0,
                     rollouts=0, failed=0, tokens=0, resumed=0)

    def report(self, shard: int, totals: dict[str, int]) -> None:
        self.shards.setdefault(shard, {"attempts": 0}).update(totals)

    def snapshot(self) -> dict[int, dict[str, Any]]:
        return {shard: dict(entry) for shard, entry in self.shards.items()}


class BoardListener:
    """run_rollouts' listener in a worker: sends this worker's totals to the board, throttled."""

    def __init__(self, board: Any, shard: int, n: int, every_s: float = 0.5):
        self.board, self.shard, self.n, self.every_s = board, shard, n, every_s
        self.totals = {"groups": 0, "stored": 0, "done": 0, "rollouts": 0, "failed": 0, "tokens": 0, "resumed": 0}
        self.sent = 0.0

    def started(self, groups: int, stored: int) -> None:
        self.totals.update(groups=groups, stored=stored, done=stored, rollouts=stored * self.n, resumed=stored * self.n)
        self.send()

    def advanced(self, rows: Sequence[dict[str, Any]], tokens: int) -> None:
        totals = self.totals
        failed = sum(r["reward"] is None for r in rows)
        totals.update(done=totals["done"] + 1, rollouts=totals["rollouts"] + len(rows),
                      failed=totals["failed"] + failed, tokens=totals["tokens"] + tokens)
        if time.monotonic() - self.sent >= self.every_s:
            self.send()

    def send(self) -> None:
        self.board.report.remote(self.shard, dict(self.totals))  # fire and forget: totals make it idempotent
        self.sent = time.monotonic()


class ClusterProgress:
    """The driver's bar over every worker's groups; workers not started yet add their groups when they start."""

    def __init__(self, workers: int, n: int, *, enabled: bool = True, console: Console | None = None):
        self.workers, self.n, self.started = workers, n, time.perf_counter()
        self.progress = Progress(TextColumn("[bold]groups"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not enabled,
                                 **({"console": console} if console is not None else {}))
        self.task = self.progress.add_task("groups", total=None, stats=f"0/{workers} workers started")

    @property
    def console(self) -> Console:
        return self.progress.console

    def __enter__(self) -> "ClusterProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def show(self, shards: dict[int, dict[str, Any]]) -> None:
        known = [s for s in shards.values() if s.get("groups") is not None]
        total = sum(s["groups"] for s in known) if len(known) == self.workers else None
        done = sum(s["done"] for s in known)
        self.progress.update(self.task, total=total, completed=done, stats=self.stats(shards))

    def stats(self, shards: dict[int, dict[str, Any]]) -> str:
        def total(key: str) -> int:
            return sum(s.get(key) or 0 for s in shards.values())

        planned = sum(s["groups"] * self.n for s in shards.values() if s.get("groups") is not None)
        rate = total("tokens") / max(time.perf_counter() - self.started, 1e-9)
        resumed = f" · {total('resumed')} resumed" if total("resumed") else ""
        running = sum(1 for s in shards.values() if s.get("attempts"))
        return (f"rollouts {total('rollouts')}/{planned}{resumed} · {total('failed')} failed · "
                f"{total('tokens'):,} tok · {rate:,.0f} tok/s · {running}/{self.workers} workers started")
