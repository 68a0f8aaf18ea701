"""Run folders of scored arithmetic rollouts, as `hubgym rollout` leaves them, written without a model.

The rows are real task rows of `arithmetic:easy` scored by its verifier; only the token ids and logprobs are
made up. `write_run` is the fixed one the stored-data tests damage; `make_run` chooses which samples answer
right; `contrasting_run` makes one the trainer can learn from."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from hubgym.envs import resolve_env
from hubgym.envs.build import build_tasks
from hubgym.hub.rollouts import iter_rollouts
from hubgym.rollout.writer import ShardWriter
from hubgym.schemas import assistant

ROWS_PER_SHARD = 4
RUN = "r1"


CREATED_AT = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)  # fixed: no test data depends on the day it runs


def write_run(folder: Path, run_id: str = RUN, groups: int = 4, n: int = 2) -> Path:
    """A run folder as `hubgym rollout` leaves it: 8 scored arithmetic rollouts in 2 shards, and the manifest."""
    return _write(folder, run_id, groups, n, ROWS_PER_SHARD, right=lambda g, s: s == 0, task_in_ids=False,
                  metric_prefix="", sampling={"temperature": 1.0})


def make_run(folder, run_id: str, groups: int = 6, n: int = 2, per_shard: int = 4, right=lambda g, s: s == 0):
    """A run folder of scored arithmetic rollouts (answers `right(group, sample)`: sample 0's, by default)."""
    return _write(Path(folder), run_id, groups, n, per_shard, right=right, task_in_ids=True, metric_prefix="reward/",
                  sampling={})


def _write(folder: Path, run_id: str, groups: int, n: int, per_shard: int, *, right, task_in_ids: bool,
           metric_prefix: str, sampling: dict) -> Path:
    verifier = resolve_env("arithmetic").verifier()
    tasks = build_tasks("arithmetic", "easy")["test"]
    writer = ShardWriter(folder, "w000of001", max_rows=per_shard)
    for g in range(groups):
        task = tasks[g % len(tasks)]
        group = f"{run_id}-{g}-{task['id']}" if task_in_ids else f"{run_id}-{g}"
        rows = []
        for s in range(n):
            completion = [assistant(f"<answer>{task['info']['answer'] if right(g, s) else 999}</answer>")]
            score = verifier.score(task, completion)
            rows.append({
                "rollout_id": f"{group}-{s}", "run_id": run_id, "task_id": task["id"], "env": "arithmetic",
                "group": group, "sample": s, "prompt": task["prompt"], "completion": completion,
                "info": task["info"], "interaction": task["interaction"], "prompt_ids": [1, 2, 3],
                "completion_ids": [4, 5], "completion_mask": [1, 1], "completion_logprobs": [-0.5, -0.5],
                "tokens_consistent": True, "reward": score.reward,
                "metrics": [{"name": metric_prefix + k, "value": v} for k, v in score.components.items()],
                "finish_reason": "stop", "truncated": False, "num_turns": 1, "error": None,
                "provenance": {"model": "m", "policy_version": 0, "sampling": "{}", "env_repo": None,
                               "env_revision": None, "verifier_module": verifier.name,
                               "verifier_sha256": verifier.sha256, "engine": "vllm", "engine_version": "0",
                               "chat_template_sha256": None},
                "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0},
                "created_at": CREATED_AT})
        writer.add_group(rows)
    writer.flush()
    writer.write_manifest({"run_id": run_id, "model": "m", "policy_version": 0, "sampling": sampling,
                           "envs": {"arithmetic": {"config": "easy", "tasks": groups}},
                           "shard_files": writer.shard_files()})
    return folder


def contrasting_run(folder: Path) -> Path:
    """Stored groups whose right sample (advantage +1) and wrong sample (-1) differ in their tokens, sampled at
    about the untrained model's logprob (1 / 1024 tokens): each step pushes the policy the same way."""
    rows = list(iter_rollouts([make_run(folder / "source", "r", groups=16, right=lambda g, s: s == 0)]))
    for row in rows:
        row["completion_ids"] = [40 + row["sample"] * 10 + i for i in range(4)]
        row["completion_mask"], row["completion_logprobs"] = [1] * 4, [-7.0] * 4
    writer = ShardWriter(folder / "run", "w000of001")
    for start in range(0, len(rows), 2):
        writer.add_group(rows[start:start + 2])
    writer.flush()
    writer.write_manifest({"run_id": "r", "model": "m", "policy_version": 0, "sampling": {},
                           "envs": {"arithmetic": {"config": "easy", "tasks": 16}},
                           "shard_files": writer.shard_files()})
    return folder / "run"
