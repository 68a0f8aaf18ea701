"""The `hubgym` command: one module per command group, each a thin layer over library calls.

    hubgym envs | init | build | check | push          hubgym.cli.envs      (environments)
    hubgym wrap                                        hubgym.cli.wrap      (any dataset as an env)
    hubgym rollout | report | push-rollouts            hubgym.cli.rollouts  (sampling and stored rollouts)
    hubgym score | replay                              hubgym.cli.score     (re-scoring and replay)
    hubgym export sft                                  hubgym.cli.export    (rollouts as a fine-tuning dataset)
    hubgym stats                                       hubgym.cli.stats     (per-task difficulty across runs)
    hubgym eval                                        hubgym.cli.evaluate  (held-out reward of a model)
    hubgym train                                       hubgym.cli.train     (GRPO)
    hubgym demo                                        hubgym.cli.demo      (the main job, hubgym.app.pipeline)
    hubgym view                                        hubgym.cli.view      (a local page over runs)
    hubgym serve                                       hubgym.cli.serve     (an OpenAI-compatible server)
    hubgym import verifiers                            hubgym.cli.imports   (other frameworks' runs)

Tables and progress bars come from hubgym.app.views, which the main job uses too; nothing below the app layer
imports it.
"""

import sys

from hubgym.cli.app import app
from hubgym.files.quick_exit import exit_now

# Each module registers its commands on `app`, in the order `hubgym --help` lists them.
from hubgym.cli import envs, wrap, rollouts, score, export, stats, evaluate, train, demo, view, serve, imports  # noqa: E402,F401,I001,E501

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point (`hubgym`, `python -m hubgym`)."""
    sys.argv[1:] = without_launcher_rank(sys.argv[1:])
    try:
        app()  # a typer app ends by raising SystemExit
    except SystemExit as done:
        exit_now(done.code)  # hubgym.files.quick_exit: 2 s less at the end of every command that loaded torch


def without_launcher_rank(args: list[str]) -> list[str]:
    """The arguments without the `--local_rank=N` that DeepSpeed's launcher puts before the command (unless
    started with `--no_local_rank`); the same value is in $LOCAL_RANK, which is what the trainer reads."""
    if args and args[0].startswith("--local_rank="):
        return args[1:]
    if len(args) > 1 and args[0] == "--local_rank":
        return args[2:]
    return args
