"""`hubgym train`: GRPO on DeepSpeed, offline on stored rollouts, then online on fresh vLLM rollouts.

    hubgym train train.yaml --set online.steps=50
    hubgym train --options                       # every training option, its default and what it does

Across nodes every node starts the same command under its launcher (hubgym.train.nodes: what must be shared):

    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --master_addr HOST0 --master_port 29500 \
        -m hubgym train train.yaml
    deepspeed --no_ssh --node_rank 0 --hostfile hosts --master_addr HOST0 --master_port 29500 --no_local_rank \
        $(which hubgym) train train.yaml
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from hubgym.app import views
from hubgym.cli.app import HUB_HELP, Verbose, app, console, user_errors
from hubgym.envs.pins import PIN_HELP, parse_pins


@app.command()
@user_errors
def train(config: Annotated[Optional[Path], typer.Argument(help="training config: a YAML file or the name of a "
                                                           "shipped one (tiny, ...) [default: the built-in defaults, "
                                                           "for a pretrained model on a GPU]")] = None,
          set_: Annotated[Optional[list[str]], typer.Option("--set", help="override an option, key.sub=value "
                                                            "(repeatable)")] = None,
          options: Annotated[bool, typer.Option("--options", help="list every option and exit")] = False,
          hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
          trust: Annotated[bool, typer.Option(help="run unpinned verifiers of hub envs")] = False,
          pin: Annotated[Optional[list[str]], typer.Option(help=PIN_HELP)] = None,
          verbose: Verbose = False) -> None:
    """GRPO on DeepSpeed: stored rollouts first (offline), then fresh vLLM rollouts of the policy (online)."""
    from hubgym.engines.vllm_logging import set_verbose

    set_verbose(verbose)
    from hubgym.train.config import describe_options, load_config
    from hubgym.models import resolve_model

    if options:
        table = Table("option", "default", "what it does", title="training options (YAML keys; --set key=value)")
        for key, default, description in describe_options():
            table.add_row(key, default, description)
        console().print(table)
        return
    from hubgym.train.trainer import Trainer

    cfg = load_config(config, set_ or [])
    resolve_model(cfg.model, setting="the `model` setting (YAML `model:`, or --set model=...)")  # before DeepSpeed
    trainer = Trainer(cfg, console=console(), hub=hub, trust=trust, pins=parse_pins(pin))
    try:
        result = trainer.run()
    except KeyboardInterrupt:  # the step being sampled is dropped; the resumed run samples it again
        trainer.close()  # first, so the message comes after vLLM's shutdown logs
        console(stderr=True).print(f"[yellow]interrupted: the same command resumes from the last checkpoint in "
                                    f"{cfg.output_dir}/checkpoints")
        raise typer.Exit(130)
    finally:
        trainer.close()
    if os.environ.get("RANK", "0") != "0":  # under a launcher the summary is rank 0's, printed once
        return
    console().print(views.before_after_table(result.before, result.after))
    console().print(Text(f"model: {result.model_dir}  metrics: {result.metrics_file}  plot: {result.plot}"),
                    soft_wrap=True)
