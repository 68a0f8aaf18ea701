"""Summaries of stored rollouts: one table row per env, and a PNG of the reward distributions.

Works on any set of shard files or run folders (lazy polars scans, so large runs stay cheap).
pass@1 is the mean success rate; pass@k is the share of groups (tasks) with at least one
success among their k samples. Success is the verifier's SUCCESS_THRESHOLD, stored per row.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from hubgym.errors import NoShardsError

SUMMARY_COLUMNS = ["env", "rollouts", "groups", "k", "mean_reward", "pass@1", "pass@k", "mean_turns",
                   "truncated", "tool_calls", "tool_errors", "errors", "empty", "tokens"]


def shard_files(sources: list[str | Path]) -> list[Path]:
    """Every `.arrow` shard under the given files or folders (hidden temporary files excluded)."""
    files: list[Path] = []
    for source in map(Path, sources):
        found = [source] if source.is_file() else sorted(source.rglob("*.arrow"))
        files += [f for f in found if not f.name.startswith(".")]
    if not files:
        raise NoShardsError(f"no rollout shards (*.arrow) under {', '.join(map(str, sources))}; "
                            f"give a run folder written by `hubgym rollout` or its shard files")
    return files


def scan_rollouts(sources: list[str | Path]) -> pl.LazyFrame:
    return pl.concat([pl.scan_ipc(f) for f in shard_files(sources)], how="vertical")


def _metric(name: str) -> pl.Expr:
    """One named metric out of the `metrics` list<struct{name, value}> column (0.0 when absent)."""
    return (pl.col("metrics").list.eval(pl.element().filter(pl.element().struct.field("name") == name)
                                        .struct.field("value")).list.first().fill_null(0.0))


def summarize(rollouts: pl.LazyFrame) -> pl.DataFrame:
    """Per-env table: rewards, pass@1/pass@k, turns, truncation, tools, errors, tokens."""
    rows = rollouts.select(
        "env", "group", "reward", "num_turns", "truncated",
        _metric("success").alias("success"), _metric("loop/tool_calls").alias("tool_calls"),
        _metric("loop/tool_errors").alias("tool_errors"), _metric("loop/empty_responses").alias("empty"),
        pl.col("error").is_not_null().alias("failed"), pl.col("completion_mask").list.sum().alias("tokens"),
    )
    groups = rows.group_by("env", "group").agg(pl.len().alias("k"), (pl.col("success").max() > 0).alias("any"))
    per_env = rows.group_by("env").agg(
        pl.len().alias("rollouts"), pl.col("reward").mean().alias("mean_reward"),
        pl.col("success").mean().alias("pass@1"), pl.col("num_turns").mean().alias("mean_turns"),
        pl.col("truncated").mean().alias("truncated"), pl.col("tool_calls").mean().alias("tool_calls"),
        (pl.col("tool_errors").sum() / pl.col("tool_calls").sum().clip(1)).alias("tool_errors"),
        pl.col("failed").mean().alias("errors"), (pl.col("empty") > 0).mean().alias("empty"),
        pl.col("tokens").sum().alias("tokens"),
    )
    per_group = groups.group_by("env").agg(pl.len().alias("groups"), pl.col("k").max().alias("k"),
                                           pl.col("any").mean().alias("pass@k"))
    return per_env.join(per_group, on="env").select(SUMMARY_COLUMNS).sort("env").collect()


def plot_rewards(rollouts: pl.LazyFrame, path: str | Path) -> Path:
    """Box plot of rewards per env, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = rollouts.select("env", "reward").drop_nulls().collect()
    envs = sorted(frame["env"].unique().to_list())
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(envs) + 2), 3.5))
    ax.boxplot([frame.filter(pl.col("env") == e)["reward"].to_list() for e in envs], tick_labels=envs)
    ax.set_ylabel("reward")
    ax.set_title("rollout rewards per environment")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
