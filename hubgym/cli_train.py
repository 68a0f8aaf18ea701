"""`hubgym push-rollouts`, `score`, `replay` and `train`: the commands after rollouts are stored.

    hubgym push-rollouts runs/r1 me/rollouts --hub hubs/local
    hubgym score runs/r1 --verifier my_envs/arith_v2.py --out runs/r1-v2
    hubgym train train.yaml --set online.steps=50
    hubgym train --options                       # every training option, its default and what it does
    hubgym replay runs/r1 --model MODEL_DIR      # re-run multi_turn dynamics, audit tokens against the template

Registered on the `hubgym` app by hubgym.cli (kept apart so neither file needs scrolling).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from hubgym import cli_views as views
from hubgym.cli import _console, app, user_errors

HUB_HELP = "'hf', a Hub-API URL, or a local hub folder [default: $HUBGYM_HUB, else ~/.cache/hubgym/hub]"


@app.command("push-rollouts")
@user_errors
def push_rollouts(run: Annotated[Path, typer.Argument(help="run folder written by `hubgym rollout`")],
                  repo: Annotated[str, typer.Argument(help="rollout dataset repo, e.g. my-org/rollouts")],
                  name: Annotated[Optional[str], typer.Option(help="config name of the run [default: run id]")] = None,
                  hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None) -> None:
    """Upload a run's shards as one config of a rollout repo (validated, resumable, one card for all runs)."""
    from hubgym.hub.rollouts import push_rollouts as push

    result = push(run, repo, hub=hub, name=name, progress=True)
    _console().print(Text(f"{result.rows} rollouts in {result.uploaded} new shard(s) ({result.skipped} already there) "
                          f"-> {result.ref}"))
    _console().print(Text(f"stream them: load_dataset(<repo>, {result.name!r}, split='train', streaming=True) "
                          f"or hubgym score {result.ref}"))


@app.command()
@user_errors
def score(sources: Annotated[list[str], typer.Argument(help="run folders, shard files or org/name\\[@rev]\\[:RUN]")],
          verifier: Annotated[Optional[list[str]], typer.Option(
              help="[ENV=]MODULE: a verifier module (.py file or import name) for the rows of ENV (repeatable; "
                   "ENV may be left out when the rows hold one env) \\[default: each env's current verifier]")] = None,
          env_revision: Annotated[Optional[str], typer.Option(help="use the verifier of this hub env, "
                                                              "org/name@revision, for the rows of its env")] = None,
          out: Annotated[Optional[Path], typer.Option(help="write re-scored shards and a manifest here")] = None,
          workers: Annotated[Optional[int], typer.Option(min=1, help="processes \\[default: every core, when the "
                                                                    "work is worth a pool]")] = None,
          plot: Annotated[Optional[Path], typer.Option(help="PNG of stored vs new rewards per env "
                                                       "\\[default: OUT/rescore.png]")] = None,
          hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
          trust: Annotated[bool, typer.Option(help="run an unpinned hub verifier")] = False,
          pin: Annotated[Optional[str], typer.Option(help="sha256:<hex> the hub verifier must have")] = None) -> None:
    """Re-score stored rollouts with the current or another verifier; print what changed (no model, no tools)."""
    import polars as pl

    from hubgym.score.rescore import plot_diff, rescore

    with rows_progress("re-scoring") as advance:
        result = rescore(sources, verifier=verifier, env_revision=env_revision, out=out, workers=workers, hub=hub,
                         trust=trust, pin=pin, progress=advance)
    console = _console()
    console.print(views.frame_table(result.counts, title=f"re-scored {result.rows} rows in {result.seconds:.1f} s "
                                                         f"({result.rows_per_s:,.0f} rows/s)"))
    diff = result.diff.with_columns(pl.col("component").replace("*", "(total)"))
    console.print(views.frame_table(diff, title=f"what changed: {result.changed} of {result.rows} rows"))
    if len(result.changes):
        shown = result.changes.head(20)
        console.print(views.frame_table(shown, title=f"changed values ({len(shown)} of {len(result.changes)})"))
    used = Table("env", "verifier", "sha256", "from", title="verifiers used", box=None)
    for env, spec in sorted(result.verifiers.items()):
        used.add_row(env, spec.module, spec.sha256[:12], spec.origin)
    console.print(used)
    for unused in result.unused:
        console.print(Text(f"note: {unused} matched no row; those rows kept their env's current verifier",
                           style="yellow"))
    if result.manifest:
        console.print(Text(f"shards: {out / 'shards'}  manifest: {result.manifest}"))
    target = plot or (out / "rescore.png" if out else None)
    if target:
        console.print(Text(f"plot: {plot_diff(result, target)}"))


@contextmanager
def rows_progress(verb: str) -> Iterator[Callable[[int, Optional[int]], None]]:
    """A rich bar fed with (rows done, total rows or None); the total shows once it is known."""
    columns = (TextColumn(f"[bold]{verb}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=_console(stderr=True), transient=True) as progress:
        bar = progress.add_task(verb, total=None, rate="")
        started = time.perf_counter()

        def advance(rows: int, total: Optional[int]) -> None:
            done = progress.tasks[0].completed + rows
            rate = done / max(time.perf_counter() - started, 1e-9)
            progress.update(bar, total=total, completed=done, rate=f"{rate:,.0f} rows/s")

        yield advance


@app.command()
@user_errors
def train(config: Annotated[Optional[Path], typer.Argument(help="training config (YAML) [default: the built-in "
                                                           "defaults]")] = None,
          set_: Annotated[Optional[list[str]], typer.Option("--set", help="override an option, key.sub=value "
                                                            "(repeatable)")] = None,
          options: Annotated[bool, typer.Option("--options", help="list every option and exit")] = False,
          hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
          trust: Annotated[bool, typer.Option(help="run unpinned verifiers of hub envs")] = False) -> None:
    """GRPO on DeepSpeed: stored rollouts first (offline), then fresh vLLM rollouts of the policy (online)."""
    from hubgym.train.config import describe_options, load_config

    if options:
        table = Table("option", "default", "what it does", title="training options (YAML keys; --set key=value)")
        for key, default, description in describe_options():
            table.add_row(key, default, description)
        _console().print(table)
        return
    from hubgym.train.trainer import Trainer

    cfg = load_config(config, set_ or [])
    trainer = Trainer(cfg, console=_console(), hub=hub, trust=trust)
    try:
        result = trainer.run()
    except KeyboardInterrupt:  # the step being sampled is dropped; the resumed run samples it again
        trainer.close()  # first, so the message comes after vLLM's shutdown logs
        _console(stderr=True).print(f"[yellow]interrupted: the same command resumes from the last checkpoint in "
                                    f"{cfg.output_dir}/checkpoints")
        raise typer.Exit(130)
    finally:
        trainer.close()
    _console().print(before_after_table(result.before, result.after))
    _console().print(Text(f"model: {result.model_dir}  metrics: {result.metrics_file}  plot: {result.plot}"))


def before_after_table(before: dict[str, float], after: dict[str, float]) -> Table:
    """eval/<env>/<metric> before and after training, one row per env and metric."""
    table = Table("env", "metric", "before", "after", "change", title="held-out evaluation", box=None)
    for key in sorted(after):
        _, env, metric = key.split("/", 2)
        old, new = before.get(key), after[key]
        change = f"{new - old:+.3f}" if old is not None and new is not None else "-"
        table.add_row(env, metric, _number(old), _number(new), change)
    return table


def _number(value: float | None) -> str:
    """A metric no row could give (every eval rollout of the env failed) shows as '-'."""
    return "-" if value is None else f"{value:.3f}"


@app.command()
@user_errors
def replay(sources: Annotated[list[str], typer.Argument(help="run folders, shard files or hub refs org/name@REV:RUN "
                                                      "(@REV and :RUN optional)")],
           rollout: Annotated[Optional[str], typer.Option(help="only this rollout id")] = None,
           model: Annotated[Optional[Path], typer.Option(help="model folder whose chat template the token audit "
                                                         "re-applies [default: no token audit]")] = None,
           verifier: Annotated[Optional[str], typer.Option(help="verifier module (file or import name) "
                                                           "[default: each row's env's current verifier]")] = None,
           hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None) -> None:
    """Re-run multi_turn dynamics from stored actions and audit tokens; exit code 1 if anything diverged."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from hubgym.score.replay import ReplayReport, as_renderer, iter_replay, rows_of

    renderer = as_renderer(model) if model else None
    report = ReplayReport()
    with Progress(SpinnerColumn(), TextColumn("[bold]replay[/] {task.completed} rollouts"), TimeElapsedColumn(),
                  console=_console(stderr=True)) as progress:
        task = progress.add_task("replay", total=None)
        for result in iter_replay(rows_of(sources, hub), rollout=rollout, renderer=renderer, verifier=verifier):
            report.results.append(result)
            progress.advance(task)
    for table in replay_tables(report):
        _console().print(table)
    changed = sum(r.verifier_changed for r in report.diverged)
    if changed:
        _console().print(Text(f"{changed} diverged row(s) were made by another version of their verifier (sha256 "
                              f"differs): the env may have changed, not the rows; pass that version with --verifier"))
    if not report.ok:
        raise typer.Exit(1)


def replay_tables(report) -> list[Table]:
    """Counts per env, then the first divergences and the first token-audit failures (20 each)."""
    counts = Table("env", *(k.replace("_", " ") for k in report.counts()), title="replay", box=None)
    for env in sorted({r.env for r in report.results}):
        counts.add_row(env, *map(str, report.counts(env).values()))
    tables = [counts]
    if report.diverged:
        table = Table("rollout", "env", "turn", "field", "stored", "replayed", title="first divergences", box=None)
        for r in report.diverged[:20]:
            d = r.divergence
            table.add_row(r.rollout_id, r.env, str(d.turn), d.field, *_where_they_differ(d.stored, d.replayed))
        tables.append(table)
    if report.token_failures:
        table = Table("rollout", "env", "token", "turn", "part", "stored", "template renders",
                      title="token audit: first token the chat template does not produce", box=None)
        for r in report.token_failures[:20]:
            a = r.audit
            table.add_row(r.rollout_id, r.env, f"{a.index}/{a.tokens}", str(a.turn), a.part, _near(a.stored),
                          _near(a.rendered))
        tables.append(table)
    return tables


def _where_they_differ(stored, replayed, width: int = 24) -> tuple[str, str]:
    """Two values as short reprs; two texts cut to where they part ways (long observations share a head)."""
    if not (isinstance(stored, str) and isinstance(replayed, str)):
        return repr(stored), repr(replayed)
    at = next((i for i, (a, b) in enumerate(zip(stored, replayed)) if a != b), min(len(stored), len(replayed)))
    return tuple(_near(text[:at] + "⟨here⟩" + text[at:], width) for text in (stored, replayed))


def _near(text: str, width: int = 24) -> str:
    """`width` characters each side of the ⟨here⟩ mark, as a repr (newlines and specials stay visible)."""
    head, _, tail = text.partition("⟨here⟩")
    return ("…" if len(head) > width else "") + repr(head[-width:] + "⟨here⟩" + tail[:width]) + (
        "…" if len(tail) > width else "")
