"""Rollout: the agent loop, token records, the shard writer, and the run (engines are in hubgym.engines).

    from hubgym.rollout import RolloutConfig, run_rollouts
    summary = run_rollouts(RolloutConfig(envs=["arithmetic:easy"], model="tiny-model", out="runs/r1", n=4, limit=8))

vLLM and torch load only when an engine is created.
"""

from hubgym.rollout.loop import LoopContext, Trajectory, run_group
from hubgym.hub.rollout_stats import scan_rollouts, summarize
from hubgym.rollout.report import plot_rewards
from hubgym.rollout.run import RolloutConfig, RunSummary, run_rollouts
from hubgym.rollout.tokens import ChatRenderer, TokenRecord
from hubgym.rollout.writer import ShardWriter

__all__ = ["ChatRenderer", "LoopContext", "RolloutConfig", "RunSummary", "ShardWriter", "TokenRecord", "Trajectory",
           "plot_rewards", "run_group", "run_rollouts", "scan_rollouts", "summarize"]
