"""A rich progress bar for rollout runs: groups done, rollouts written, generated tokens/s."""

from __future__ import annotations

import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RolloutProgress:
    def __init__(self, groups: int, n: int, enabled: bool = True):
        self.enabled, self.n = enabled, n
        self.tokens, self.rollouts, self.started = 0, 0, time.perf_counter()
        self.progress = Progress(TextColumn("[bold]rollouts"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not enabled)
        self.task = self.progress.add_task("rollouts", total=groups * n, stats="")

    def __enter__(self) -> "RolloutProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def advance(self, rollouts: int, tokens: int) -> None:
        self.rollouts += rollouts
        self.tokens += tokens
        rate = self.tokens / max(time.perf_counter() - self.started, 1e-9)
        self.progress.update(self.task, advance=rollouts,
                             stats=f"groups {self.rollouts // self.n} · {self.tokens} tok · {rate:,.0f} tok/s")
