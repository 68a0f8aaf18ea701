"""`hubgym import`: runs written by other frameworks, as hubgym runs.

    hubgym import verifiers outputs/my-run --out runs/from-verifiers --model tiny
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from hubgym.app import views
from hubgym.cli.app import app, console, user_errors

imports = typer.Typer(name="import", no_args_is_help=True, help="Runs written by other frameworks, as hubgym runs.")
app.add_typer(imports)


@imports.command("verifiers")
@user_errors
def verifiers(results: Annotated[Path, typer.Argument(help="the run folder vf-eval wrote (or its traces.jsonl)")],
              out: Annotated[Path, typer.Option(help="the hubgym run folder to write")],
              model: Annotated[str, typer.Option(
                  help="the model the traces sampled (tiny, smollm2-135m, a folder or a Hub id): its tokenizer and "
                       "chat template re-derive token ids a trace lacks, its weights the logprobs")],
              logprobs: Annotated[bool, typer.Option(
                  help="re-derive missing logprobs with a forward pass of --model (without them the trainer "
                       "leaves the rows out)")] = True) -> None:
    """Turn verifiers 0.4 traces of a hubgym env (`vf-eval hubgym_verifiers ...`) into a run folder that `report`,
    `score`, `view` and `train` read; what the traces lack is re-derived and flagged on each row."""
    from hubgym.integrations.verifiers_import import import_verifiers

    with views.rows_progress(console(stderr=True), "importing traces") as advance:
        summary = import_verifiers(results, out, model=model, logprobs=logprobs,
                                   progress=lambda rows: advance(rows, None))
    shown = console()
    envs = ", ".join(f"{env} {n}" for env, n in sorted(summary.envs.items()))
    shown.print(Text(f"{summary.rows} rollouts ({envs}) -> {summary.out} (run {summary.run_id}); token ids "
                     f"re-derived for {summary.rederived_tokens}, logprobs for {summary.rederived_logprobs}"))
    shown.print(Text(f"next: hubgym report {summary.out}"))
