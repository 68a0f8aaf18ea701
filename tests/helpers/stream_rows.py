"""A complete, schema-valid rollout row for the training stream, any field overridden."""

from __future__ import annotations

import datetime as dt


def row(env: str, group: int, sample: int, reward: float | None, *, n_prompt=3, n_completion=4, **overrides) -> dict:
    base = {
        "rollout_id": f"{env}-{group}-{sample}", "run_id": "r", "task_id": f"t{group}", "env": env,
        "group": f"{env}-g{group}", "sample": sample, "prompt": [], "info": {"k": group},
        "completion": [{"role": "assistant", "content": "x", "tool_calls": None, "tool_call_id": None, "name": None,
                        "reasoning": None}] if n_completion else [],
        "interaction": {"kind": "single_turn", "max_turns": 1, "tools": [], "tool_rewards": [], "max_tokens": None},
        "prompt_ids": list(range(1, n_prompt + 1)), "completion_ids": [7] * n_completion,
        "completion_mask": [1] * n_completion, "completion_logprobs": [-1.0] * n_completion,
        "tokens_consistent": True, "reward": reward, "metrics": [], "finish_reason": "stop", "truncated": False,
        "num_turns": 1, "error": None,
        "provenance": {"model": "m", "policy_version": 0, "sampling": "{}", "env_repo": None, "env_revision": None,
                       "verifier_module": "v", "verifier_sha256": "0", "engine": "vllm", "engine_version": "0",
                       "chat_template_sha256": None},
        "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0},
        "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    }
    return {**base, **overrides}
