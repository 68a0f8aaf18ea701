"""`hubgym push-rollouts`, `score`, `replay` and `train`: the commands after rollouts are stored.

    hubgym push-rollouts runs/r1 me/rollouts --hub hubs/local
    hubgym score runs/r1 --verifier my_envs/arith_v2.py --out runs/r1-v2
    hubgym train train.yaml --set online.steps=50
    hubgym train --options                       # every training option, its default and what it does
    hubgym replay runs/r1 --model MODEL_DIR      # re-run multi_turn dynamics, audit tokens against the template

Registered on the `hubgym` app by hubgym.cli (kept apart so neither file needs scrolling).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
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

    with _console().status(f"pushing {run} to {repo}"):
        result = push(run, repo, hub=hub, name=name)
    _console().print(Text(f"{result.rows} rollouts in {result.uploaded} new shard(s) ({result.skipped} already there) "
                          f"-> {result.ref}"))
    _console().print(Text(f"stream them: load_dataset(<repo>, {result.name!r}, split='train', streaming=True) "
                          f"or hubgym score {result.ref}"))


@app.command()
@user_errors
def score(sources: Annotated[list[str], typer.Argument(help="run folders, shard files or org/name[@rev][:RUN]")],
          verifier: Annotated[Optional[str], typer.Option(help="verifier module (file or import name) "
                                                          "[default: each row's env's current verifier]")] = None,
          env_revision: Annotated[Optional[str], typer.Option(help="use the verifier of this hub env, "
                                                              "org/name@revision")] = None,
          out: Annotated[Optional[Path], typer.Option(help="write re-scored shards here")] = None,
          workers: Annotated[Optional[int], typer.Option(min=1, help="processes [default: all cores]")] = None,
          plot: Annotated[Optional[Path], typer.Option(help="PNG of old vs new rewards")] = None,
          hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
          trust: Annotated[bool, typer.Option(help="run an unpinned hub verifier")] = False,
          pin: Annotated[Optional[str], typer.Option(help="sha256:<hex> the hub verifier must have")] = None) -> None:
    """Re-score stored rollouts with the current or another verifier; print what changed (no model, no tools)."""
    from hubgym.score.rescore import plot_diff, rescore

    if verifier and env_revision:
        raise typer.BadParameter("give --verifier or --env-revision, not both")
    with _console().status("re-scoring"):
        result = rescore(sources, verifier=verifier, env_revision=env_revision, out=out, workers=workers, hub=hub,
                         trust=trust, pin=pin)
    _console().print(views.frame_table(result.diff, title=f"re-score: {result.changed} of {result.rows} rows changed "
                                                          f"({result.rows / max(result.seconds, 1e-9):,.0f} rows/s)"))
    for env, used in sorted(result.verifiers.items()):
        _console().print(Text(f"{env}: {used}"))
    target = plot or (out / "rescore.png" if out else None)
    if target:
        _console().print(Text(f"plot: {plot_diff(result, target)}"))


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
        table.add_row(env, metric, "-" if old is None else f"{old:.3f}", f"{new:.3f}", change)
    return table


@app.command()
@user_errors
def replay(sources: Annotated[list[str], typer.Argument(help="run folders, shard files or org/name[@rev][:RUN]")],
           rollout: Annotated[Optional[str], typer.Option(help="only this rollout id")] = None,
           model: Annotated[Optional[Path], typer.Option(help="model folder whose chat template the token audit "
                                                         "re-applies [default: no token audit]")] = None,
           hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None) -> None:
    """Re-run multi_turn dynamics from stored actions (and audit tokens); exit code 1 if anything diverged."""
    from hubgym.score.replay import replay as run_replay

    with _console().status("replaying"):
        report = run_replay(sources, rollout=rollout, model=model, hub=hub)
    counts = Table(*report.counts(), title="replay", box=None)
    counts.add_row(*map(str, report.counts().values()))
    _console().print(counts)
    if report.diverged:
        table = Table("rollout", "env", "turn", "field", "stored", "replayed", title="first divergences", box=None)
        for r in report.diverged[:20]:
            d = r.divergence or r.token_divergence
            table.add_row(r.rollout_id, r.env, str(d.turn), d.field, repr(d.stored)[:60], repr(d.replayed)[:60])
        _console().print(table)
        raise typer.Exit(1)
