"""`hubgym score` and `hubgym replay`: re-score stored rollouts, re-run their dynamics and audit their tokens.

    hubgym score runs/r1 --verifier my_envs/arith_v2.py --out runs/r1-v2
    hubgym score runs/r1 --out runs/r1-v2 --ray --ray-address HEAD:6379   # the shards mapped over a Ray cluster
    hubgym replay runs/r1 --model MODEL_DIR      # re-run multi_turn dynamics, audit tokens against the template
"""

from __future__ import annotations

import itertools
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from hubgym.app import views
from hubgym.schemas.text import plain
from hubgym.cli.app import HUB_HELP, SKIP_BAD_HELP, app, console, fail, skipped_shards_noted, user_errors
from hubgym.errors import StoredEnvError


@app.command()
@user_errors
def score(sources: Annotated[list[str], typer.Argument(help="run folders, shard files or org/name\\[@rev]\\[:RUN]")],
          verifier: Annotated[Optional[list[str]], typer.Option(
              help="[ENV=]MODULE: a verifier module (.py file or import name) for the rows of ENV (repeatable; "
                   "ENV may be left out when the rows hold one env) \\[default: each env's current verifier]")] = None,
          env_revision: Annotated[Optional[list[str]], typer.Option(
              help="org/name@revision: the verifier of this hub env scores the rows of its env (repeatable: one "
                   "per env; mixes with --verifier for other envs)")] = None,
          out: Annotated[Optional[Path], typer.Option(help="write re-scored shards and a manifest here")] = None,
          workers: Annotated[Optional[int], typer.Option(min=1, help="processes \\[default: every core, when the "
                                                                    "work is worth a pool]")] = None,
          plot: Annotated[Optional[Path], typer.Option(help="PNG of stored vs new rewards per env "
                                                       "\\[default: OUT/rescore.png]")] = None,
          hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
          trust: Annotated[bool, typer.Option(help="run unpinned hub verifiers")] = False,
          pin: Annotated[Optional[list[str]], typer.Option(help="REPO=sha256:<hex>: the verifier a hub env must have "
                                                                "(repeatable; sha256:<hex> alone with one "
                                                                "--env-revision)")] = None,
          skip_bad: Annotated[bool, typer.Option(help=SKIP_BAD_HELP)] = False,
          ray: Annotated[bool, typer.Option("--ray", help="re-score on a Ray cluster (RAY_ADDRESS's, else a local "
                                                          "one), one task per shard; sources and --out on a "
                                                          "filesystem every node sees; needs hubgym\\[ray]")] = False,
          ray_address: Annotated[Optional[str], typer.Option(help="with --ray: the cluster's head HOST:PORT, or "
                                                                  "'auto'")] = None) -> None:
    """Re-score stored rollouts with the current or another verifier; print what changed (no model, no tools)."""
    import polars as pl

    from hubgym.score.rescore import plot_diff, rescore

    options = {"verifier": verifier, "env_revision": env_revision, "out": out, "workers": workers, "hub": hub,
               "trust": trust, "pin": pin, "skip_bad": skip_bad}
    if ray or ray_address is not None:  # connected before the bar starts: an address that does not answer is one line
        from hubgym.cluster.ray_common import connect
        from hubgym.cluster.ray_score import rescore_on_ray

        connect(ray_address)
        run = lambda **kw: rescore_on_ray(sources, address=ray_address, **kw)  # noqa: E731
    else:
        run = lambda **kw: rescore(sources, **kw)  # noqa: E731
    try:
        with skipped_shards_noted(), views.rows_progress(console(stderr=True), "re-scoring") as advance:
            result = run(progress=advance, **options)
    except StoredEnvError as exc:
        fail(with_command(exc, "score", sources, hub))
    out_console = console()
    out_console.print(views.frame_table(result.counts, title=f"re-scored {result.rows} rows in {result.seconds:.1f} s "
                                                         f"({result.rows_per_s:,.0f} rows/s)"))
    diff = result.diff.with_columns(pl.col("component").replace("*", "(total)"))
    out_console.print(views.frame_table(diff, title=f"what changed: {result.changed} of {result.rows} rows"))
    if len(result.changes):
        shown = result.changes.head(20)
        out_console.print(views.frame_table(shown, title=f"changed values ({len(shown)} of {len(result.changes)})"))
    used = Table("env", "verifier", "sha256", "from", title="verifiers used", box=None)
    for env, spec in sorted(result.verifiers.items()):
        used.add_row(plain(env), plain(spec.module), spec.sha256[:12], plain(spec.origin))
    out_console.print(used)
    for unused in result.unused:
        out_console.print(Text(f"note: {plain(unused)} matched no row; those rows kept their env's current "
                               f"verifier", style="yellow"))
    if result.manifest:
        out_console.print(Text(f"shards: {out / 'shards'}  manifest: {result.manifest}"))
    target = plot or (out / "rescore.png" if out else None)
    if target:
        try:
            out_console.print(Text(f"plot: {plot_diff(result, target)}"))
        except Exception as exc:  # noqa: BLE001 - the re-score is complete (and written): a plot never undoes it
            out_console.print(Text(f"note: no plot drawn ({type(exc).__name__}: {plain(str(exc))[:200]}); the "
                                   f"re-score itself is complete", style="yellow"))


@app.command()
@user_errors
def replay(sources: Annotated[list[str], typer.Argument(help="run folders, shard files or hub refs org/name@REV:RUN "
                                                      "(@REV and :RUN optional)")],
           rollout: Annotated[Optional[str], typer.Option(help="only this rollout id")] = None,
           model: Annotated[Optional[str], typer.Option(help="model folder whose chat template the token audit "
                                                        "re-applies; 'tiny': the tiny local model, as for `hubgym "
                                                        "rollout` [default: no token audit]")] = None,
           verifier: Annotated[Optional[list[str]], typer.Option(
               help="[ENV=]MODULE: a verifier module (.py file or import name) for the rows of ENV (repeatable) "
                    "\\[default: each env's registered verifier]")] = None,
           env_revision: Annotated[Optional[list[str]], typer.Option(
               help="org/name@revision: the verifier of this hub env replays the rows of its env (repeatable)")]
           = None,
           hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
           trust: Annotated[bool, typer.Option(help="run unpinned hub verifiers")] = False,
           pin: Annotated[Optional[list[str]], typer.Option(help="REPO=sha256:<hex>: the verifier a hub env must have "
                                                                 "(repeatable)")] = None,
           skip_bad: Annotated[bool, typer.Option(help=SKIP_BAD_HELP)] = False) -> None:
    """Re-run multi_turn dynamics from stored actions and audit tokens; exit code 1 if anything diverged."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from hubgym.models import resolve_model
    from hubgym.score.choice import VerifierChoice
    from hubgym.score.replay import ReplayReport, as_renderer, iter_replay, rows_of

    choice = VerifierChoice(verifier, env_revision, trust=trust, pin=pin, hub=hub)
    rows = iter(rows_of(sources, hub, skip_bad=skip_bad))
    with skipped_shards_noted():  # the first row is read before the model loads: its shards' notes come here
        first = next(rows, None)
    try:
        if first is not None:
            choice.spec(first["env"])  # a refusal needs no model: it comes before the tokenizer loads
    except StoredEnvError as exc:
        fail(with_command(exc, "replay", sources, hub))
    tokenizer = ("tokenizer_config.json", "config.json")  # the audit needs the tokenizer and its chat template
    renderer = as_renderer(resolve_model(model, setting="--model", needs=tokenizer)) if model else None
    report = ReplayReport()
    with skipped_shards_noted(), Progress(SpinnerColumn(), TextColumn("[bold]replay[/] {task.completed} rollouts"),
                                          TimeElapsedColumn(), console=console(stderr=True)) as progress:
        task = progress.add_task("replay", total=None)
        rows = itertools.chain([first] if first else [], rows)
        if renderer is not None:  # the tokenizer is known from here: its vocabulary bounds the ids
            rows = in_vocabulary(rows, len(renderer.tokenizer), model)
        replayed = iter_replay(rows, rollout=rollout, renderer=renderer, verifier=choice)
        try:
            for result in replayed:
                report.results.append(result)
                progress.advance(task)
        except StoredEnvError as exc:
            fail(with_command(exc, "replay", sources, hub))
    for table in views.replay_tables(report):
        console().print(table)
    if renderer is None:
        console().print(Text("token audit skipped: give --model MODEL_DIR (the model that sampled the rows; 'tiny' "
                              "for the tiny local model) to re-apply its chat template and compare the stored tokens",
                              style="yellow"), soft_wrap=True)
    changed = sum(r.verifier_changed for r in report.diverged)
    if changed:
        console().print(Text(f"{changed} diverged row(s) were made by another version of their verifier (sha256 "
                              f"differs): the env may have changed, not the rows; pass that version with --verifier"),
                        soft_wrap=True)
    if not report.ok:
        raise typer.Exit(1)


def in_vocabulary(rows, vocab_size: int, model: str):
    """The rows, each held to the row contract's vocabulary rule once the tokenizer is known (its ids re-rendered by
    a tokenizer that lacks them would be read as other text); ShardError naming the rollout, column and rule."""
    from hubgym.errors import ShardError
    from hubgym.schemas.row_contract import shown, vocabulary_breach

    for row in rows:
        breach = vocabulary_breach(row, vocab_size)
        if breach is not None:
            raise ShardError(f"rollout {shown(row.get('rollout_id'))} of run {shown(row.get('run_id'))}: column "
                             f"{breach.column!r} {breach.message()} (--model {model}); replay it with the model "
                             f"that sampled it", column=breach.column, rule=breach.rule.name)
        yield row


def with_command(exc: StoredEnvError, command: str, sources: list[str], hub: str | None) -> str:
    """The refusal, plus the full command that scores these rows with the hub env revision their provenance names
    (its revision and code pin, as recorded when they were sampled); nothing is run: the user reads and runs it.
    Stored values are checked by the Hub's own rules before they are shown, and quoted for the shell."""
    from hubgym.hub.names import check_repo_id, check_revision, normalize_pin
    from hubgym.score.replay import rows_of

    row = next((r for r in rows_of(sources, hub) if r["env"] == exc.env), None)
    provenance = (row or {}).get("provenance") or {}
    try:
        repo, revision = check_repo_id(provenance["env_repo"]), check_revision(provenance["env_revision"])
        pin = normalize_pin(provenance["env_code_sha256"])
    except Exception:  # noqa: BLE001 - no (valid) hub provenance: the refusal's own advice stands
        return str(exc)
    flags = [f"--env-revision {repo}@{revision}", f"--pin {repo}=sha256:{pin}"] + ([f"--hub {hub}"] if hub else [])
    line = " ".join(["hubgym", command, *map(shlex.quote, sources), *flags])
    return (f"{exc}. These rows were sampled from the hub env {repo}@{revision} (their provenance says so); to "
            f"score them with its code, read it on the hub, then run: {line}")
