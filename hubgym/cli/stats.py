"""`hubgym stats`: per-task difficulty across rollout runs, as a dataset that merges as new runs arrive.

    hubgym stats runs/r1 runs/r2 --out stats/                          # compute, write, print per env
    hubgym stats runs/r3 --merge me/task-stats --push me/task-stats   # add a run to stats on a hub
    hubgym stats --merge stats/ --check arithmetic:sums --split test  # check stored stats against an env
"""

from __future__ import annotations

import math

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from hubgym.app import views
from hubgym.cli.app import HUB_HELP, SKIP_BAD_HELP, app, console, fail, skipped_shards_noted, user_errors


@app.command()
@user_errors
def stats(sources: Annotated[Optional[list[str]], typer.Argument(
              help="rollout run folders, shard files or rollout repos org/name\\[@rev]\\[:RUN]")] = None,
          merge: Annotated[Optional[list[str]], typer.Option(
              help="stored stats to merge in: a folder (--out) or a hub repo (--push) (repeatable)")] = None,
          out: Annotated[Optional[Path], typer.Option(help="write the stats folder here (atomically)")] = None,
          push: Annotated[Optional[str], typer.Option(
              help="add the stats to this hub repo org/name (merged with the stats it holds; one commit)")] = None,
          hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
          threshold: Annotated[Optional[list[str]], typer.Option(
              help="ENV=X: a row of ENV passes when its reward >= X (repeatable) \\[default: the row's recorded "
                   "success, else the env's SUCCESS_THRESHOLD]")] = None,
          check: Annotated[Optional[list[str]], typer.Option(
              help="ENV[:CONFIG]: fail unless every task id the stats hold for ENV is one of its tasks (repeatable: "
                   "configs of one env add up)")] = None,
          split: Annotated[str, typer.Option(help="the split --check reads")] = "test",
          skip_bad: Annotated[bool, typer.Option(help=SKIP_BAD_HELP)] = False) -> None:
    """Per-task statistics (samples, mean reward, pass rate, last policy version, runs) across runs; merge, store,
    push. Prints per env: tasks, samples, mean pass rate and the share of tasks with 0 < pass rate < 1."""
    from hubgym.stats import TaskStats, check_tasks, load_stats, open_stats, push_stats, write_stats

    if not sources and not merge:
        fail("give rollout SOURCES, or stored stats with --merge")
    for source in sources or []:
        if open_stats(source, hub) is not None:
            fail(f"{source} holds task stats, not rollouts; pass it with --merge {source}")
    thresholds = parse_thresholds(threshold)
    with skipped_shards_noted(), views.rows_progress(console(stderr=True), "reading rollouts") as advance:
        result = load_stats(list(merge or []), hub=hub, stats_only=True) if merge else TaskStats()
        if sources:
            result = result.merge(TaskStats.from_rollouts(sources, hub=hub, thresholds=thresholds,
                                                          skip_bad=skip_bad, progress=advance))
    if check:
        check_tasks(result, _opened_with_tasks(check, split, hub), split)
    shown = console()
    summary = result.summary().rename({"signal": "share 0<pass<1"})
    shown.print(views.frame_table(summary, title=f"task stats: {result.tasks().height} tasks, {len(result.runs)} runs"))
    if out is not None:
        shown.print(Text(f"stats: {write_stats(result, out)}"))
    if push:
        shown.print(Text(f"pushed: {push_stats(result, push, hub=hub).ref}"))


def parse_thresholds(items: list[str] | None) -> dict[str, float]:
    """--threshold ENV=X (repeatable) -> {env: X}."""
    out = {}
    for item in items or []:
        env, eq, value = item.partition("=")
        try:
            out[env] = float(value)
        except ValueError:
            eq = ""
        if not eq or not env or not math.isfinite(out.get(env, 0.0)):
            raise typer.BadParameter(f"--threshold {item!r}: write ENV=X with a finite number X, e.g. arithmetic=1.0")
    return out


def _opened_with_tasks(specs: list[str], split: str, hub: str | None) -> list:
    """Each env of `--check`, opened, with every task of `split` read."""
    from hubgym.envs import open_env

    envs = [open_env(spec, hub=hub) for spec in specs]
    for env in envs:
        env.take(split)
    return envs
