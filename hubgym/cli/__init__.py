"""The `hubgym` command: one module per command group, each a thin layer over library calls.

    hubgym envs | init | build | check | push          hubgym.cli.envs      (environments)
    hubgym wrap                                        hubgym.cli.wrap      (any dataset as an env)
    hubgym rollout | report | push-rollouts            hubgym.cli.rollouts  (sampling and stored rollouts)
    hubgym score | replay                              hubgym.cli.score     (re-scoring and replay)
    hubgym stats                                       hubgym.cli.stats     (per-task difficulty across runs)
    hubgym eval                                        hubgym.cli.evaluate  (held-out reward of a model)
    hubgym train                                       hubgym.cli.train     (GRPO)
    hubgym demo                                        hubgym.cli.demo      (the main job, hubgym.pipeline)

Tables and progress bars come from hubgym.views, which the main job uses too; nothing below the CLI
imports it.
"""

from hubgym.cli.app import app

# Each module registers its commands on `app`, in the order `hubgym --help` lists them.
from hubgym.cli import envs, wrap, rollouts, score, stats, evaluate, train, demo  # noqa: E402,F401,I001

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point (`hubgym`, `python -m hubgym`)."""
    app()
