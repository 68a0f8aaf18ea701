"""Per-task statistics across rollout runs: computed from stored rows, merged exactly, summarized per env.

    stats = TaskStats.from_rollouts(["runs/r1", "org/rollouts:r2"])   # run folders, shard files, hub refs
    stats = stats.merge(TaskStats.from_rollouts("runs/r3"))           # idempotent, order-independent
    stats.tasks()      # polars: one row per (env, task_id): samples, reward_mean, pass_rate, runs, ...
    stats.summary()    # polars: one row per env: tasks, samples, mean pass rate, share with GRPO signal

What is stored is finer than what is shown: one *part* per (env, task_id, run_id), its counts and sums.
A merge is then a union of parts, so merging the same run twice counts it once, and the order of merges
never changes the result. A run folder read again after it grew (a resumed run) gives the same part with
more rows; the merge keeps the part with the most rows, since a run only ever grows.

A row counts as a sample when it has a reward (rows whose rollout or verifier failed count in `errors`,
as in `hubgym report`). It passes when the row's recorded `success` metric is 1 (what `hubgym rollout`
and the trainer write), else when its reward reaches the env's SUCCESS_THRESHOLD, read from the env's
verifier through hubgym.envs.stored (stored data never chooses code) or given as `thresholds`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import polars as pl
import pyarrow as pa

from hubgym.errors import EnvContractError, Where

KEY = ("env", "task_id", "run_id")
PART_SCHEMA = pl.Schema({
    "env": pl.String, "task_id": pl.String, "run_id": pl.String,
    "samples": pl.Int64,  # rows with a reward
    "errors": pl.Int64,  # rows without one (the rollout or the verifier failed)
    "reward_sum": pl.Float64, "passes": pl.Int64,
    "policy_version": pl.Int64,  # the largest of the part's rows
    "first_seen": pl.Datetime("us", "UTC"), "last_seen": pl.Datetime("us", "UTC"),  # rows' created_at
})
ROW_COLUMNS = ("rollout_id", "run_id", "task_id", "env", "reward", "metrics", "provenance", "created_at")
"""The rollout columns statistics read (a few small ones of each row)."""
REQUIRED_FIELDS = ("rollout_id", "run_id", "task_id", "env")
THRESHOLD_SLACK = 1e-9  # as Verifier.succeeded: a reward equal to the threshold up to rounding passes


@dataclass(frozen=True)
class TaskStats:
    """Statistics of tasks across runs, as parts (one per env, task_id, run_id); see the module docstring."""

    parts: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PART_SCHEMA))

    @classmethod
    def from_rollouts(cls, sources: Any, *, hub: Any = None, thresholds: Mapping[str, float] | None = None,
                      skip_bad: bool = False, progress: Callable[[int, int | None], None] | None = None) -> "TaskStats":
        """Statistics of stored rollouts: run folders, shard files or hub refs `org/name[@rev][:RUN]` (a list mixes
        them). Each shard is checked as `iter_batches` checks it; a row read twice (the same source given twice)
        counts once. `progress(rows, None)` is called after each batch (a rich bar's `advance`)."""
        from hubgym.hub.rollouts import iter_batches

        frames = []
        for batch in iter_batches(sources, hub=hub, skip_bad=skip_bad):
            frames.append(slim_rows(batch))
            if progress is not None:
                progress(batch.num_rows, None)
        rows = pl.concat(frames) if frames else slim_rows(None)
        return cls(parts_of_rows(rows, thresholds))

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], *,
                  thresholds: Mapping[str, float] | None = None) -> "TaskStats":
        """Statistics of rollout rows as dicts (what the trainer and `iter_rollouts` hand out)."""
        return cls(parts_of_rows(frame_of_dicts(list(rows)), thresholds))

    def merge(self, *others: "TaskStats") -> "TaskStats":
        """These stats and `others` together; a run two of them hold counts once (see merge_parts)."""
        return TaskStats(merge_parts([self.parts, *(o.parts for o in others)]))

    @property
    def runs(self) -> list[str]:
        return sorted(self.parts["run_id"].unique().to_list())

    def tasks(self) -> pl.DataFrame:
        """One row per (env, task_id), sorted: samples, errors, reward_sum, reward_mean, passes, pass_rate,
        last_policy_version, first_seen, last_seen, runs (sorted run ids)."""
        return task_rows(self.parts)

    def summary(self) -> pl.DataFrame:
        """One row per env: tasks, samples, mean_pass_rate (over tasks with a sample), signal (share of those
        tasks whose pass rate is strictly between 0 and 1: the groups GRPO learns from)."""
        return env_summary(self.tasks())


def slim_rows(batch: pa.RecordBatch | None) -> pl.DataFrame:
    """The columns statistics need from a batch of rollout rows, `success` pulled out of `metrics`."""
    if batch is None:
        return pl.DataFrame(schema={"rollout_id": pl.String, "run_id": pl.String, "task_id": pl.String,
                                    "env": pl.String, "reward": pl.Float64, "success": pl.Float64,
                                    "policy_version": pl.Int64, "created_at": pl.Datetime("us", "UTC")})
    frame = pl.from_arrow(pa.Table.from_batches([batch.select(list(ROW_COLUMNS))]))
    success = (pl.col("metrics").list.eval(pl.element().filter(pl.element().struct.field("name") == "success")
                                           .struct.field("value")).list.first())
    return frame.select(
        "rollout_id", "run_id", "task_id", "env", pl.col("reward").cast(pl.Float64), success.alias("success"),
        pl.col("provenance").struct.field("policy_version").cast(pl.Int64).alias("policy_version"),
        pl.col("created_at").cast(pl.Datetime("us", "UTC")))


def frame_of_dicts(rows: list[Mapping[str, Any]]) -> pl.DataFrame:
    """Rollout rows as dicts -> the frame `slim_rows` makes; a row missing a field statistics need is an
    EnvContractError naming its env, rollout id and field."""
    out = []
    for row in rows:
        where = Where(env=_text(row.get("env")), row=_text(row.get("rollout_id")))
        for name in (*REQUIRED_FIELDS, "reward"):
            if name not in row or (name != "reward" and not isinstance(row[name], str)):
                raise EnvContractError(f"rollout row has no {name!r} (a string{' or None' * (name == 'reward')})",
                                       Where(where.env, row=where.row, field=name),
                                       "pass rollout rows as `hubgym rollout` or the trainer writes them")
        metrics = {m.get("name"): m.get("value") for m in row.get("metrics") or []}
        out.append({"rollout_id": row["rollout_id"], "run_id": row["run_id"], "task_id": row["task_id"],
                    "env": row["env"], "reward": row["reward"], "success": metrics.get("success"),
                    "policy_version": (row.get("provenance") or {}).get("policy_version"),
                    "created_at": row.get("created_at")})
    return pl.DataFrame(out, schema=slim_rows(None).schema) if out else slim_rows(None)


def parts_of_rows(rows: pl.DataFrame, thresholds: Mapping[str, float] | None = None) -> pl.DataFrame:
    """Rows -> parts. A rollout id seen twice counts once; rows are summed in rollout-id order, so the same
    rows always give bit-identical sums."""
    _check_required(rows)
    rows = rows.unique("rollout_id", keep="first").sort("rollout_id")
    passed = _passed(rows, thresholds or {})
    parts = rows.with_columns(passed=passed).group_by(list(KEY), maintain_order=True).agg(
        samples=pl.col("reward").is_not_null().sum().cast(pl.Int64),
        errors=pl.col("reward").is_null().sum().cast(pl.Int64),
        reward_sum=pl.col("reward").fill_null(0.0).sum(),
        passes=pl.col("passed").sum().cast(pl.Int64),
        policy_version=pl.col("policy_version").max(),
        first_seen=pl.col("created_at").min(), last_seen=pl.col("created_at").max())
    return parts.select(list(PART_SCHEMA)).cast(dict(PART_SCHEMA)).sort(list(KEY))


def _check_required(rows: pl.DataFrame) -> None:
    for name in REQUIRED_FIELDS:
        missing = rows.filter(pl.col(name).is_null() | (pl.col(name) == ""))
        if len(missing):
            first = missing.row(0, named=True)
            raise EnvContractError(f"rollout row has no {name!r} ({len(missing)} row(s) like it)",
                                   Where(env=first["env"], row=first["rollout_id"], field=name),
                                   "statistics need env, task_id, run_id and rollout_id on every row; re-write the "
                                   "run with `hubgym rollout`")


def _passed(rows: pl.DataFrame, thresholds: Mapping[str, float]) -> pl.Expr:
    """Whether each scored row passed: a given threshold, else the row's `success`, else the env's verifier's
    SUCCESS_THRESHOLD (looked up only for envs with rows that lack `success`)."""
    scored = pl.col("reward").is_not_null()
    need = rows.filter(scored & pl.col("success").is_null() & ~pl.col("env").is_in(list(thresholds)))
    known = dict(thresholds)
    for env, rollout_id in need.group_by("env", maintain_order=True).agg(pl.col("rollout_id").first()).iter_rows():
        known[env] = verifier_threshold(env, rollout_id)
    limit = pl.col("env").replace_strict(known, default=None, return_dtype=pl.Float64)
    by_threshold = pl.col("reward") >= limit - THRESHOLD_SLACK
    recorded = pl.col("success") > 0
    given = pl.col("env").is_in(list(thresholds))
    return scored & pl.when(given).then(by_threshold).when(pl.col("success").is_not_null()).then(recorded) \
        .otherwise(by_threshold).fill_null(False)


def verifier_threshold(env: str, rollout_id: str | None = None) -> float:
    """The SUCCESS_THRESHOLD of the verifier of a built-in or installed env that rows name (never code that the
    rows choose: hubgym.envs.stored refuses anything else, saying how to choose)."""
    from hubgym.errors import EnvNotFoundError
    from hubgym.envs import stored_env_verifier

    try:
        return stored_env_verifier(env, Where(env=env, row=rollout_id, field="reward")).success_threshold
    except EnvNotFoundError as exc:
        raise EnvNotFoundError(f"{exc}; for statistics, --threshold {env}=X (thresholds={{{env!r}: X}}) says "
                               f"which reward passes instead") from None


def merge_parts(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Union of parts; for a (env, task_id, run_id) held twice, the part with the most rows (ties: the largest
    values), so merging is idempotent, commutative and associative."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return pl.DataFrame(schema=PART_SCHEMA)
    both = pl.concat(frames).with_columns(rows=pl.col("samples") + pl.col("errors"))
    order = ["rows", "samples", "passes", "reward_sum", "policy_version", "last_seen", "first_seen"]
    ranked = both.sort([*KEY, *order], descending=[False] * len(KEY) + [True] * len(order), nulls_last=True)
    return ranked.unique(list(KEY), keep="first", maintain_order=True).drop("rows")


def task_rows(parts: pl.DataFrame) -> pl.DataFrame:
    tasks = parts.sort(list(KEY)).group_by(["env", "task_id"], maintain_order=True).agg(
        pl.col("samples").sum(), pl.col("errors").sum(), pl.col("reward_sum").sum(), pl.col("passes").sum(),
        pl.col("policy_version").max().alias("last_policy_version"),
        pl.col("first_seen").min(), pl.col("last_seen").max(), pl.col("run_id").alias("runs"))
    per_sample = pl.when(pl.col("samples") > 0)
    return tasks.with_columns(
        reward_mean=per_sample.then(pl.col("reward_sum") / pl.col("samples")),
        pass_rate=per_sample.then(pl.col("passes") / pl.col("samples")),
    ).select("env", "task_id", "samples", "errors", "reward_sum", "reward_mean", "passes", "pass_rate",
             "last_policy_version", "first_seen", "last_seen", "runs")


def env_summary(tasks: pl.DataFrame) -> pl.DataFrame:
    seen = pl.col("samples") > 0
    return tasks.group_by("env").agg(
        pl.len().alias("tasks"), pl.col("samples").sum(),
        pl.col("pass_rate").filter(seen).mean().alias("mean_pass_rate"),
        ((pl.col("pass_rate") > 0) & (pl.col("pass_rate") < 1)).filter(seen).mean().alias("signal"),
    ).sort("env")


def check_tasks(stats: TaskStats, envs: Iterable[Any], split: str) -> None:
    """Every task id of the stats that names one of `envs` (hubgym.envs.OpenedEnv, opened by the caller) is a task
    of that env; else an EnvContractError naming env, config(s), split, the row and field `task_id`.
    Envs the stats name but `envs` lacks are not checked."""
    known: dict[str, tuple[set[str], list[str]]] = {}
    for env in envs:
        ids, configs = known.setdefault(env.env, (set(), []))
        ids.update(task["id"] for task in env.tasks)
        configs.append(env.config)
    tasks = stats.tasks().select("env", "task_id")
    for name, (ids, configs) in known.items():
        foreign = tasks.filter((pl.col("env") == name) & ~pl.col("task_id").is_in(list(ids)))
        if len(foreign):
            task_id = foreign["task_id"][0]
            raise EnvContractError(
                f"stats name task {task_id!r} of env {name!r}, which its config(s) {', '.join(configs)} do not hold "
                f"in split {split!r} ({len(foreign)} task id(s) like it)",
                Where(name, ",".join(configs), split, task_id, "task_id"),
                "check the stats against the configs and split their runs sampled, or recompute the stats from "
                "this env's runs")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
