"""A rich progress bar for rollout runs: this worker's groups, rollouts, failures and generated tokens/s.

    groups ━━━━━━━━━━━━━━━━━━━━ 6/8 rollouts 24/32 · 8 resumed · 1 failed · 4,096 tok · 812 tok/s 0:00:05

The bar counts groups (tasks) of this worker only (with `--num-shards N`, each worker has its own bar over
its own tasks). Groups stored by an earlier call of the same run count as done from the start, so a
resumed run starts where the last one stopped; `resumed` says how many rollouts that was. `failed` counts
the rollouts of this call that have no reward (their rollout or verifier failed; they are stored and
counted as done, with the error on the row). Tokens are model tokens (mask 1) sampled by this call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RolloutProgress:
    def __init__(self, groups: int, n: int, *, stored: int = 0, enabled: bool = True, console: Console | None = None):
        """`groups`: this worker's groups, `stored` of them already on disk; `n`: rollouts per group."""
        self.groups, self.n, self.stored = groups, n, stored
        self.groups_done, self.rollouts, self.failed, self.tokens = stored, stored * n, 0, 0
        self.started = time.perf_counter()
        self.progress = Progress(TextColumn("[bold]groups"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not enabled,
                                 **({"console": console} if console is not None else {}))
        self.task = self.progress.add_task("groups", total=groups, completed=stored, stats=self.stats())

    def __enter__(self) -> "RolloutProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def advance(self, rows: Sequence[dict[str, Any]], tokens: int) -> None:
        """One finished group: its stored rows and the model tokens they sampled."""
        self.groups_done += 1
        self.rollouts += len(rows)
        self.failed += sum(r["reward"] is None for r in rows)
        self.tokens += tokens
        self.progress.update(self.task, completed=self.groups_done, stats=self.stats())

    def stats(self) -> str:
        rate = self.tokens / max(time.perf_counter() - self.started, 1e-9)
        resumed = f" · {self.stored * self.n} resumed" if self.stored else ""
        return (f"rollouts {self.rollouts}/{self.groups * self.n}{resumed} · {self.failed} failed · "
                f"{self.tokens:,} tok · {rate:,.0f} tok/s")
