"""Valid rollout rows of a tool_use env (calc_tools) as ShardWriter takes them, and the ids a shard holds."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa

from hubgym.rollout.writer import worker_name
from hubgym.schemas import assistant, interaction, tool_result, user
from hubgym.schemas.rollouts import Rollout

WORKER = worker_name(0, 1)


def make_row(task: int, sample: int, tokens: int = 6) -> Rollout:
    """A valid rollout row: a tool turn with mask-0 tokens between two model turns."""
    ids = list(range(100, 100 + tokens))
    mask = [1, 1] + [0] * (tokens - 3) + [1]
    return {
        "rollout_id": f"run-t{task}-{sample}", "run_id": "run", "task_id": f"t{task}", "env": "calc_tools",
        "group": f"run-t{task}", "sample": sample, "prompt": [user(f"What is {task} * 3?")],
        "completion": [assistant("calling"), tool_result(str(task * 3), "call-0-0", "calculator"),
                       assistant(f"<answer>{task * 3}</answer>")],
        "info": {"answer": str(task * 3), "nested": {"k": [1, 2]}},
        "interaction": interaction("tool_use", max_turns=4, tools=["calculator"]),
        "prompt_ids": [1, 2, 3], "completion_ids": ids, "completion_mask": mask,
        "completion_logprobs": [-0.5 if m else 0.0 for m in mask], "tokens_consistent": True,
        "reward": 1.0, "metrics": [{"name": "reward/correct", "value": 1.0}], "finish_reason": "stop",
        "truncated": False, "num_turns": 2, "error": None,
        "provenance": {"model": "tiny", "policy_version": 0, "sampling": "{}", "env_repo": None, "env_revision": None,
                       "verifier_module": "hubgym.verifiers.calc_tools", "verifier_sha256": "0" * 64,
                       "engine": "vllm", "engine_version": "0.32.0", "chat_template_sha256": "1" * 64},
        "timings": {"generate_s": 0.1, "tools_s": 0.01, "score_s": 0.001, "total_s": 0.111},
        "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    }


def group(task: int, n: int = 2) -> list[Rollout]:
    return [make_row(task, i) for i in range(n)]


def read_ids(path: Path) -> list[str]:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all().column("rollout_id").to_pylist()
