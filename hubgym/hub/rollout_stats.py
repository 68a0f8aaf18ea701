"""Summaries of stored rollouts: one table row per env, read from checked shards (`hubgym report`, the rollout
repo cards, evaluation); the PNG of the same numbers is drawn in hubgym.rollout.report.

Works on any set of shard files or run folders (lazy polars scans, so large runs stay cheap).
A row is *scored* when it has a finite reward; a row whose rollout or scoring failed has none, counts in
`errors`, and is left out of every reward metric (mean_reward, pass@1, pass@k and no_answer all
use the same scored rows). A stored reward that is not finite (NaN, inf: no hubgym writer stores one) is no
reward either: it counts in `errors`, and `non_finite_rewards` names those rows. Success is the verifier's
SUCCESS_THRESHOLD, stored per row as `success`.

    rollouts, groups     rows, and tasks (GRPO groups); n: samples per group (the largest group)
    errors               share of rows without a reward (the rollout or the verifier failed)
    mean_reward          mean reward of the scored rows
    pass@1               share of the scored rows that succeeded
    pass@k               the unbiased estimator of Chen et al. (2021), 1 - C(s-c, k) / C(s, k) for a group
                         of s scored rows with c successes, averaged over groups; k has its own column: by
                         default the smallest group's s (so, with nothing failed, k = n: "any of n samples")
    no_answer            share of scored rows where the env's `parse_answer` found no answer (the
                         answer-format failure rate); empty for envs whose verifier has no parser
    tool_parse_failures  share of rows with a tool call whose text did not parse (tool-call JSON only)
"""

from __future__ import annotations

from math import comb
from pathlib import Path

import polars as pl

from hubgym.errors import NoShardsError

SUMMARY_COLUMNS = ["env", "rollouts", "groups", "n", "errors", "mean_reward", "pass@1", "k", "pass@k", "no_answer",
                   "mean_turns", "truncated", "empty", "tool_calls", "tool_errors", "tool_parse_failures", "tokens"]


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


REPORT_COLUMNS = ("rollout_id", "env", "group", "reward", "num_turns", "truncated", "metrics", "completion_mask")
"""What the summaries and the plot read of each row."""


def scan_rollouts(sources: list[str | Path], *, skip_bad: bool = False) -> pl.LazyFrame:
    """REPORT_COLUMNS of every shard under `sources`, each shard checked first as iter_rollouts checks it (the
    sha256 its run manifest records, every batch fully validated and held to the writer's rules, rows): a bad
    shard or manifest raises ShardError or ManifestError naming it, or with `skip_bad` a bad shard is left out
    (one SkippedShardsWarning names it).

    The rows are scanned lazily by pyarrow (the reader that checked them), as a dataset of those columns with
    their rollout schema types and no stored metadata: polars never parses a stored file itself, so schema or
    field metadata that pyarrow ignores cannot trip it. Extra columns (re-scoring's) are left out."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from hubgym.hub.rollout_reader import local_shard_sources, verified_shards
    from hubgym.schemas.rollouts import ROLLOUT_SCHEMA

    shards = local_shard_sources(sources)
    files = [loaded.source.location for loaded in verified_shards(shards, skip_bad=skip_bad)]
    schema = pa.schema([ROLLOUT_SCHEMA.field(name).remove_metadata() for name in REPORT_COLUMNS])
    return pl.scan_pyarrow_dataset(ds.dataset(files, format="arrow", schema=schema))


SCORED = pl.col("reward").is_not_null() & pl.col("reward").is_finite().fill_null(False)
"""A row with a reward, and a finite one: the rows every reward column is over."""


def non_finite_rewards(rollouts: pl.LazyFrame) -> pl.DataFrame:
    """env, rows, values (up to 3 of them, as text), first (a rollout id): the rows whose stored reward is not a
    finite number, counted in `errors`."""
    bad = rollouts.filter(pl.col("reward").is_not_null() & ~pl.col("reward").is_finite())
    return (bad.group_by("env").agg(pl.len().alias("rows"), pl.col("reward").unique().head(3).cast(pl.String)
                                    .alias("values"), pl.col("rollout_id").first().alias("first"))
            .sort("env").collect())


def _metric(name: str, default: float | None = 0.0) -> pl.Expr:
    """One named metric out of the `metrics` list<struct{name, value}> column (`default` when absent)."""
    value = (pl.col("metrics").list.eval(pl.element().filter(pl.element().struct.field("name") == name)
                                         .struct.field("value")).list.first())
    return value if default is None else value.fill_null(default)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that k of n samples, c of them successes, drawn without replacement hold a success
    (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), for 1 <= k <= n."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(rollouts: pl.LazyFrame, k: int | None = None) -> pl.DataFrame:
    """Per-env table of SUMMARY_COLUMNS (see the module docstring). pass@k uses `k`, capped per env at its
    smallest group of scored rows (by default that smallest group)."""
    if k is not None and k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    rows = rollouts.select(
        "env", "group", "reward", "num_turns", "truncated", SCORED.alias("scored"),
        (_metric("success") > 0).alias("success"), (1.0 - _metric("reward/answer_found", None)).alias("no_answer"),
        _metric("loop/tool_calls").alias("tool_calls"), _metric("loop/tool_errors").alias("tool_errors"),
        (_metric("loop/parse_errors") > 0).alias("tool_parse_failures"),
        (_metric("loop/empty_responses") > 0).alias("empty"), pl.col("completion_mask").list.sum().alias("tokens"),
    )
    scored = pl.col("scored")
    per_env = rows.group_by("env").agg(
        pl.len().alias("rollouts"), (~scored).mean().alias("errors"),
        pl.col("reward").filter(scored).mean().alias("mean_reward"),
        pl.col("success").filter(scored).mean().alias("pass@1"), pl.col("no_answer").filter(scored).mean(),
        pl.col("num_turns").mean().alias("mean_turns"), pl.col("truncated").mean(), pl.col("empty").mean(),
        pl.col("tool_calls").mean(), pl.col("tool_parse_failures").mean(), pl.col("tokens").sum(),
        (pl.col("tool_errors").sum() / pl.col("tool_calls").sum().clip(1)).alias("tool_errors"),
    ).collect()
    groups = rows.group_by("env", "group").agg(pl.len().alias("size"), scored.sum().alias("s"),
                                                (pl.col("success") & scored).sum().alias("c")).collect()
    sizes = groups.group_by("env").agg(pl.len().alias("groups"), pl.col("size").max().alias("n"))
    return (per_env.join(sizes, on="env").join(_pass_at_k(groups, k), on="env", how="left")
            .select(SUMMARY_COLUMNS).sort("env"))


def _pass_at_k(groups: pl.DataFrame, k: int | None) -> pl.DataFrame:
    """env, k, pass@k from one row per group (s scored rows, c successes); groups with no scored row are left out."""
    tally = groups.filter(pl.col("s") > 0).group_by("env", "s", "c").agg(pl.len().alias("count"))
    out = []
    for (env,), part in tally.group_by("env"):
        k_env = min(int(part["s"].min()), k or int(part["s"].min()))
        total = sum(count * pass_at_k(s, c, k_env) for s, c, count in part.select("s", "c", "count").iter_rows())
        out.append({"env": env, "k": k_env, "pass@k": total / part["count"].sum()})
    return pl.DataFrame(out, schema={"env": pl.String, "k": pl.Int64, "pass@k": pl.Float64})


def reward_components(rollouts: pl.LazyFrame) -> pl.DataFrame:
    """env, component, mean: each `reward/<name>` metric averaged over the scored rows that carry it."""
    return (rollouts.filter(SCORED).select("env", pl.col("metrics").alias("m"))
            .explode("m").drop_nulls("m").unnest("m").filter(pl.col("name").str.starts_with("reward/"))
            .group_by("env", pl.col("name").str.strip_prefix("reward/").alias("component"))
            .agg(pl.col("value").cast(pl.Float64).mean().alias("mean")).sort("env", "component").collect())
