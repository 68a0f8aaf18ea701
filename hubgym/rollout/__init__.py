"""Rollout: engines (vLLM offline, OpenAI-compatible servers), the agent loop, and the shard writer.

    from hubgym.rollout import RolloutConfig, run_rollouts
    summary = run_rollouts(RolloutConfig(envs=["arithmetic:easy"], model="tiny-model", out="runs/r1", n=4, limit=8))

vLLM and torch load only when an engine is created.
"""

from hubgym.rollout.engines import Engine, EngineError, OpenAIEngine, RequestError, Sample, SamplingArgs, VLLMEngine
from hubgym.rollout.loop import LoopContext, Trajectory, run_group
from hubgym.hub.rollout_stats import scan_rollouts, summarize
from hubgym.rollout.report import plot_rewards
from hubgym.rollout.run import RolloutConfig, RunSummary, run_rollouts
from hubgym.rollout.server import VLLMServer
from hubgym.rollout.tokens import ChatRenderer, TokenRecord
from hubgym.rollout.writer import ShardWriter

__all__ = ["ChatRenderer", "Engine", "EngineError", "LoopContext", "OpenAIEngine", "RequestError", "RolloutConfig",
           "RunSummary", "Sample", "SamplingArgs", "ShardWriter", "TokenRecord", "Trajectory", "VLLMEngine",
           "VLLMServer", "plot_rewards", "run_group", "run_rollouts", "scan_rollouts", "summarize"]
