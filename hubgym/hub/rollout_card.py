"""The README.md of a rollout repo: YAML `configs:` (one per run) for `load_dataset`, and a page per run for people.

    run_summary(shards, manifests)   # -> the run's summary.json: provenance + per-worker stats
                                     #    (rollout_stats.summarize)
    render_card(repo, runs)          # runs: {name: (index.json, summary.json)} of every run in the repo

Stats are kept per worker (the prefix of the shard names, e.g. w000of004) so that workers pushing
their own slices of one run into the same config add up: each push replaces only its own workers'
stats, and the card combines them (means weighted by the rows they are over).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hubgym.hub.manifest import StoredFile, expect
from hubgym.hub.rollout_stats import scan_rollouts, summarize

_PROVENANCE = ("model", "policy_version", "engine", "engine_version", "split", "n", "sampling",
               "chat_template_sha256", "schema_version")


def worker_of(shard: str) -> str:
    """`w000of004-00012.arrow` -> `w000of004` (the writer's worker name)."""
    return Path(shard).name.rsplit("-", 1)[0]


def run_summary(shards: list[Path], manifests: list[dict]) -> dict[str, Any]:
    """Provenance from the manifests (same for every worker of a run) and stats per worker and env."""
    import polars as pl

    first = next((m for m in manifests if m.get("model")), manifests[0] if manifests else {})
    envs: dict[str, dict] = {}
    for manifest in manifests:
        envs.update(manifest.get("envs") or {})
    workers: dict[str, dict] = {}
    for worker in sorted({worker_of(p.name) for p in shards}):
        scan = scan_rollouts([p for p in shards if worker_of(p.name) == worker])
        rewarded = {r["env"]: r["rewarded"] for r in
                    scan.group_by("env").agg(pl.col("reward").count().alias("rewarded")).collect().to_dicts()}
        workers[worker] = {r["env"]: {**_clean(r), "rewarded": rewarded[r["env"]]}
                           for r in summarize(scan).to_dicts()}
    return {**{k: first.get(k) for k in _PROVENANCE if k in first}, "envs": envs, "workers": workers}


def merge_summaries(old: dict | None, new: dict) -> dict:
    """`new` with the stats of workers that only `old` has (pushed from elsewhere) kept."""
    workers = {**((old or {}).get("workers") or {}), **new["workers"]}
    return {**new, "envs": {**((old or {}).get("envs") or {}), **new["envs"]}, "workers": dict(sorted(workers.items()))}


def env_stats(summary: dict) -> dict[str, dict]:
    """Per env, the workers' stats combined: sums of counts, means weighted by the rows they are over."""
    out: dict[str, dict] = {}
    for stats in (summary.get("workers") or {}).values():
        for env, s in stats.items():
            acc = out.setdefault(env, {"rollouts": 0, "groups": 0, "rewarded": 0, "reward_sum": 0.0,
                                       "success_sum": 0.0, "passk_sum": 0.0, "passk_groups": 0, "ks": set(),
                                       "errors_sum": 0.0, "tokens": 0})
            acc["rollouts"] += s["rollouts"]
            acc["groups"] += s["groups"]
            acc["rewarded"] += s["rewarded"]
            acc["reward_sum"] += (s["mean_reward"] or 0.0) * s["rewarded"]
            acc["success_sum"] += (s["pass@1"] or 0.0) * s["rewarded"]  # pass@1 is over the rewarded rows
            if s.get("pass@k") is not None:  # pass@k is over groups with a rewarded row (k = s["k"])
                acc["passk_sum"] += s["pass@k"] * s["groups"]
                acc["passk_groups"] += s["groups"]
                acc["ks"].add(s.get("k"))
            acc["errors_sum"] += s["errors"] * s["rollouts"]
            acc["tokens"] += s["tokens"]
    return {env: {"rollouts": a["rollouts"], "groups": a["groups"],
                  "mean_reward": a["reward_sum"] / a["rewarded"] if a["rewarded"] else None,
                  "success": a["success_sum"] / a["rewarded"] if a["rewarded"] else None,
                  # workers that estimated pass@k with different k (a failed row shrinks a group) do not combine
                  "pass@k": a["passk_sum"] / a["passk_groups"] if a["passk_groups"] and len(a["ks"]) == 1 else None,
                  "k": next(iter(a["ks"])) if len(a["ks"]) == 1 else None,
                  "errors": a["errors_sum"] / max(a["rollouts"], 1), "tokens": a["tokens"]}
            for env, a in sorted(out.items())}


def read_summary(stored: StoredFile) -> dict:
    """A run's summary.json as a repo holds it (other workers' stats are kept from it), checked as far as the
    card reads it: `envs` and `workers` objects of objects, every stat a number; else ManifestError naming it."""
    summary, fail = stored.read(), stored.fail
    for key in ("envs", "workers"):
        for name, value in (expect(summary.get(key), (dict, type(None)), key, fail) or {}).items():
            expect(value, (dict,), f"{key}.{name}", fail)
    for worker, per_env in (summary.get("workers") or {}).items():
        for env, stats in per_env.items():
            for key, value in expect(stats, (dict,), f"workers.{worker}.{env}", fail).items():
                expect(value, (int, float, type(None)), f"workers.{worker}.{env}.{key}", fail)
    try:
        env_stats(summary)
    except (KeyError, TypeError) as exc:  # a stat missing, or null where the card adds it up
        raise fail(f"has worker stats the card cannot add up ({type(exc).__name__}: {exc})", "workers") from None
    return summary


def render_card(repo: str, runs: dict[str, tuple[dict, dict | None]]) -> str:
    """README.md: front matter with one config per run, then a section per run."""
    meta = {"pretty_name": f"Rollouts: {repo}", "tags": ["hubgym", "reinforcement-learning", "rl-rollouts"],
            "configs": [{"config_name": run, "data_files": [{"split": "train", "path": f"{run}/shards/*.arrow"}]}
                        for run in sorted(runs)]}
    intro = (f"# Rollouts: {repo}\n\nRollout runs made with hubgym: one config per run, Arrow shards with the prompt, "
             f"the completion, token ids, behaviour logprobs, loss masks, rewards and provenance of every sampled "
             f"trajectory. Every shard's sha256 is in `<run>/index.json`.\n")
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n" + intro + "".join(
        _run_section(repo, run, runs[run][0], runs[run][1] or {}) for run in sorted(runs))


def _run_section(repo: str, run: str, index: dict, summary: dict) -> str:
    shards = index.get("shards") or {}
    facts = [("model", f"`{summary.get('model')}` (policy version {summary.get('policy_version')})"),
             ("engine", f"{summary.get('engine') or '-'} {summary.get('engine_version') or ''}".rstrip()),
             ("sampling", f"`{json.dumps(summary.get('sampling'), sort_keys=True)}`"),
             ("rollouts", f"{sum(s['rows'] for s in shards.values()):,} in {len(shards)} shard(s), "
                          f"{len(summary.get('workers') or {})} worker(s)")]
    lines = [f"\n## Run `{run}`\n", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in facts), "",
             "| env | config | env repo @ revision | verifier (sha256) | rollouts | groups | mean reward | success "
             "| pass@k | errors |", "|---|---|---|---|---|---|---|---|---|---|"]
    stats = env_stats(summary)
    for env in sorted(set(stats) | set(summary.get("envs") or {})):
        e, s = (summary.get("envs") or {}).get(env, {}), stats.get(env, {})
        where = f"`{e['env_repo']}@{e.get('env_revision')}`" if e.get("env_repo") else "built-in"
        verifier = (f"`{e['verifier_module']}` ({str(e.get('verifier_sha256'))[:12]})" if e.get("verifier_module")
                    else "-")
        passk = _num(s.get("pass@k")) + (f" (k={s['k']})" if s.get("k") else "")
        lines.append(f"| `{env}` | {e.get('config', '-')} | {where} | {verifier} | {s.get('rollouts', 0):,} | "
                     f"{s.get('groups', 0):,} | {_num(s.get('mean_reward'))} | {_num(s.get('success'))} | "
                     f"{passk} | {_num(s.get('errors'))} |")
    lines += ["", "```python", "import datasets, hubgym.hub.rollouts as hr",
              f"rows = datasets.load_dataset({repo!r}, {run!r}, split=\"train\", streaming=True)",
              f"rows = hr.iter_rollouts({f'{repo}:{run}'!r})  # each shard checked against index.json", "```", ""]
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _clean(row: dict) -> dict:
    """A summarize() row as JSON-ready numbers (the env is the key)."""
    return {k: (float(v) if isinstance(v, float) else v) for k, v in row.items() if k != "env"}
