"""Numbers about rollouts, for the training log: per-env metrics of a step's rows, and held-out evaluation.

`env_metrics(rows)` summarizes the rows a step sampled or read (reward and its components,
success, answer-format and tool-call parse failures, truncation, empty replies, tokens) under
`env/<env>/...`: `no_answer` is the share of rewarded rows whose env parser found no answer (the
`answer_found` component; absent for envs without `parse_answer`), `tool_parse_failures` the share
of rows with a tool call whose text did not parse.
`evaluate(...)` samples each env's held-out split with the engine serving the current weights,
writes the rows as a normal rollout run (so `hubgym report` reads them), and returns
`eval/<env>/{reward, reward_ci95, pass@1, pass@k, truncated}`. `reward_ci95` is the half-width of a 95%
confidence interval of the mean reward with the task as the unit (a task's n samples are not independent
draws: they share its difficulty), so a change in reward larger than both intervals is more than noise.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from hubgym.engines import SamplingArgs


def _metric(row: dict[str, Any], name: str) -> float | None:
    for m in row.get("metrics") or []:
        if m["name"] == name:
            return m["value"]
    return None


def env_metrics(rows: list[dict[str, Any]], prefix: str = "env") -> dict[str, float]:
    by_env: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_env[row["env"]].append(row)
    out: dict[str, float] = {}
    for env, env_rows in by_env.items():
        scored = [r for r in env_rows if r.get("reward") is not None]
        key = f"{prefix}/{env}"
        out[f"{key}/rollouts"] = len(env_rows)
        out[f"{key}/reward"] = sum(r["reward"] for r in scored) / len(scored) if scored else float("nan")
        components = {m["name"] for r in scored for m in r.get("metrics") or [] if m["name"].startswith("reward/")}
        for name in sorted(components):
            values = [v for r in scored if (v := _metric(r, name)) is not None]
            out[f"{key}/{name}"] = sum(values) / len(values) if values else float("nan")
        # over the same rewarded rows as reward (a failed rollout counts in errors, not as a failure to succeed)
        successes = sum((_metric(r, "success") or 0.0) for r in scored)
        out[f"{key}/success"] = successes / len(scored) if scored else float("nan")
        found = [v for r in scored if (v := _metric(r, "reward/answer_found")) is not None]
        if found:
            out[f"{key}/no_answer"] = sum(v == 0 for v in found) / len(found)
        tool_parse_failures = sum((_metric(r, "loop/parse_errors") or 0) > 0 for r in env_rows)
        out[f"{key}/tool_parse_failures"] = tool_parse_failures / len(env_rows)
        out[f"{key}/truncated"] = sum(bool(r.get("truncated")) for r in env_rows) / len(env_rows)
        out[f"{key}/empty"] = sum((_metric(r, "loop/empty_responses") or 0) > 0 for r in env_rows) / len(env_rows)
        out[f"{key}/errors"] = sum(r.get("error") is not None for r in env_rows) / len(env_rows)
        out[f"{key}/tokens"] = sum(sum(r.get("completion_mask") or []) for r in env_rows)
    return out


def evaluate(engine, envs: list[str], *, model: str, out: Path, step: int, split: str, limit: int, n: int,
             temperature: float, max_tokens: int, seed: int, max_model_len: int, hub: str | None = None,
             trust: bool = False, pins: dict[str, str] | None = None,
             chat_options: dict[str, Any] | None = None) -> dict[str, float]:
    """Sample the held-out split of each env with the current weights; eval/<env>/* metrics. `chat_options`:
    tool_parser, reasoning_parser, chat_template_kwargs, as the online rollouts use them."""
    from hubgym.hub.rollout_stats import scan_rollouts, summarize
    from hubgym.rollout.run import RolloutConfig, run_rollouts

    config = RolloutConfig(envs=envs, model=model, out=str(out / f"step-{step:06d}"), n=n, limit=limit, split=split,
                           sampling=SamplingArgs(temperature=temperature, max_tokens=max_tokens, seed=seed),
                           policy_version=step, max_model_len=max_model_len, hub=hub, trust=trust,
                           pins=dict(pins or {}), **(chat_options or {}))
    run_rollouts(config, engine=engine, progress=False)
    table = summarize(scan_rollouts([config.out]))
    metrics: dict[str, float] = {}
    for row in table.iter_rows(named=True):
        for name in ("mean_reward", "pass@1", "pass@k", "truncated"):
            label = "reward" if name == "mean_reward" else name
            metrics[f"eval/{row['env']}/{label}"] = row[name]
    for env, half_width in reward_ci95(config.out).items():
        metrics[f"eval/{env}/reward_ci95"] = half_width
    return metrics


def reward_ci95(run: str | Path) -> dict[str, float]:
    """Per env: 1.96 standard errors of the mean reward over tasks (each task's mean over its samples);
    NaN with fewer than two tasks."""
    from hubgym.hub.rollout_reader import iter_rollouts

    by_task: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in iter_rollouts(run):
        if row.get("reward") is not None:
            by_task[row["env"]][row["task_id"]].append(row["reward"])
    out = {}
    for env, tasks in by_task.items():
        means = [sum(r) / len(r) for r in tasks.values()]
        out[env] = 1.96 * statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else float("nan")
    return out
