"""What a re-score changed: per env and component, row by row, and as a plot.

A row's total reward is component `*`; its named components are the `reward/<name>` metrics.
A value changed when it moved by more than 1e-9, or appeared, or vanished (a verifier that now
raises, a component the new verifier adds or drops). Rows whose rollout failed are carried
unscored: their total (null before and after) never counts as changed.

The tally folds rows into aggregates every `fold_rows` rows, so memory grows with the rows that
changed, not with the rows read.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from hubgym.schemas.text import plain
from hubgym.score.scoring import RESCORED_BOUNDARY

TOL = 1e-9
COLUMNS = ["rollout_id", "env", "reward", "metrics", "error", "rescore_reward", "rescore_metrics", "rescore_error"]
TOTAL = "*"
PREFIX = "reward/"


@dataclass
class Diff:
    summary: pl.DataFrame  # env, component, rows, changed, mean_old, mean_new, max_abs_delta
    changes: pl.DataFrame  # rollout_id, env, component, old, new: every value that changed
    counts: pl.DataFrame  # per env: rows, rescored, carried, stored_errors, null_rewards, rescore_errors, changed
    pairs: pl.DataFrame  # env, old, new, rows: total rewards rounded to 0.01 (the plot's points)


class Tally:
    """Accumulates re-scored tables (each with COLUMNS) into a Diff.

    background: fold in a thread of its own (the Arrow and polars work releases the GIL, so it overlaps the
    scoring this process does meanwhile); `result` waits for it."""

    def __init__(self, fold_rows: int = 65536, *, background: bool = False):
        self.fold_rows, self.pending, self.pending_rows = fold_rows, [], 0
        self.parts: dict[str, list[pl.DataFrame]] = {"summary": [], "changes": [], "counts": [], "pairs": []}
        self.folding: list[Future] = []
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="hubgym-tally") if background else None

    def add(self, table: pa.Table | pa.RecordBatch) -> None:
        self.pending.append((pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table)
                            .select(COLUMNS))
        self.pending_rows += table.num_rows
        if self.pending_rows >= self.fold_rows:
            self.fold()

    def fold(self) -> None:
        """Aggregate the pending tables into `parts` (small: grows with envs, components and changed rows)."""
        if not self.pending:
            return
        tables, self.pending, self.pending_rows = self.pending, [], 0
        if self.executor is not None:
            self.folding.append(self.executor.submit(aggregate, tables))
        else:
            self._keep(aggregate(tables))

    def _keep(self, parts: dict[str, pl.DataFrame]) -> None:
        for key, frame in parts.items():
            self.parts[key].append(frame)

    def _settle(self) -> None:
        for future in self.folding:
            self._keep(future.result())
        self.folding = []
        if self.executor is not None:
            self.executor.shutdown()

    def result(self) -> Diff:
        self.fold()
        self._settle()
        summary, changes, counts, pairs = (pl.concat(self.parts[k]) if self.parts[k] else None
                                           for k in ("summary", "changes", "counts", "pairs"))
        if summary is None:
            return _empty()
        count, total = ({side: pl.col(f"{kind}_{side}").sum() for side in ("old", "new")} for kind in ("n", "sum"))
        mean = {side: pl.when(count[side] > 0).then(total[side] / count[side]) for side in ("old", "new")}
        summary = (summary.group_by("env", "component")
                   .agg(pl.col("rows").sum(), pl.col("changed").sum(), mean["old"].alias("mean_old"),
                        mean["new"].alias("mean_new"), pl.col("max_abs_delta").max())
                   .sort("env", pl.col("component") != TOTAL, "component"))
        counts = counts.group_by("env").agg(pl.all().sum()).sort("env")
        pairs = pairs.group_by("env", "old", "new").agg(pl.col("rows").sum()).sort("env", "old", "new")
        return Diff(summary, changes.sort("env", "rollout_id", "component"), counts, pairs)


def aggregate(tables: list[pa.Table]) -> dict[str, pl.DataFrame]:
    """Tally.parts of some re-scored tables: per (env, component) sums, the changed values, per-env counts and
    the (old, new) reward pairs."""
    table = pa.concat_tables(tables, promote_options="permissive").combine_chunks()
    frame, long = flat_and_long(table)
    return {
        "summary": long.group_by("env", "component").agg(
            pl.len().alias("rows"), pl.col("changed").sum(), pl.col("old").sum().alias("sum_old"),
            pl.col("old").count().alias("n_old"), pl.col("new").sum().alias("sum_new"),
            pl.col("new").count().alias("n_new"), (pl.col("old") - pl.col("new")).abs().max().alias("max_abs_delta")),
        "changes": long.filter("changed").select("rollout_id", "env", "component", "old", "new"),
        "counts": frame.group_by("env").agg(
            pl.len().alias("rows"), (~pl.col("carried")).sum().alias("rescored"), pl.col("carried").sum(),
            pl.col("stored_error").sum().alias("stored_errors"),
            pl.col("reward").is_null().sum().alias("null_rewards"),
            (pl.col("rescore_error") & ~pl.col("carried")).sum().alias("rescore_errors"),
            changed(pl.col("reward"), pl.col("rescore_reward")).sum().alias("changed")),
        "pairs": frame.drop_nulls(["reward", "rescore_reward"]).group_by(
            "env", pl.col("reward").round(2).alias("old"), pl.col("rescore_reward").round(2).alias("new")).len("rows"),
    }


def changed(old: pl.Expr, new: pl.Expr) -> pl.Expr:
    """Moved by more than TOL, appeared or vanished."""
    return ((old - new).abs() > TOL).fill_null(False) | (old.is_null() != new.is_null())


def flat_and_long(table: pa.Table) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(one line per row: rollout_id, env, reward, rescore_reward, carried, stored_error, rescore_error as flags;
    `long_form`'s lines) of a table with COLUMNS.

    Fast path: where the stored and the new `reward/*` metrics name the same components in the same order on
    every re-scored row (the same verifier, or one that changed only values), the two sides line up one to
    one and are paired in Arrow, without decoding the nested columns into polars or joining; anything else
    (components added, dropped or reordered, duplicated names) takes `long_form`'s join."""
    error = table.column("error")
    boundary = pc.struct_field(error, "boundary")
    carried = pc.fill_null(pc.and_(error.is_valid(), pc.not_equal(boundary, RESCORED_BOUNDARY)), False)
    frame = pl.from_arrow(pa.table({
        "rollout_id": table.column("rollout_id"), "env": table.column("env"), "reward": table.column("reward"),
        "rescore_reward": table.column("rescore_reward"), "carried": carried, "stored_error": error.is_valid(),
        "rescore_error": table.column("rescore_error").is_valid()}))
    scored = pc.invert(carried)
    old = _flat_components(table.column("metrics"), scored)
    new = _flat_components(table.column("rescore_metrics"), scored)
    if not (old[0].equals(new[0]) and old[1].equals(new[1])):
        return frame, long_form(_flags(pl.from_arrow(table)))
    total = frame.select("rollout_id", "env", pl.lit(TOTAL).alias("component"), pl.col("reward").alias("old"),
                         pl.col("rescore_reward").alias("new"))
    rows, names = old[0], old[1]
    parts = pl.from_arrow(pa.table({
        "rollout_id": pc.take(table.column("rollout_id"), rows), "env": pc.take(table.column("env"), rows),
        "component": pc.utf8_slice_codeunits(names, len(PREFIX)), "old": old[2], "new": new[2]}))
    both = pl.concat([total, parts.select(total.columns)], how="vertical_relaxed")
    return frame, both.with_columns(changed=changed(pl.col("old"), pl.col("new")))


def _flat_components(metrics: pa.ChunkedArray, scored: pa.ChunkedArray) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(row, name, value) of every `reward/*` metric of the re-scored rows, in row order."""
    metrics = metrics.combine_chunks()
    items = pc.list_flatten(metrics)
    rows = pc.list_parent_indices(metrics)
    names = pc.struct_field(items, "name")
    keep = pc.and_(pc.and_(items.is_valid(), pc.starts_with(names, PREFIX)), pc.take(scored, rows))
    keep = pc.fill_null(keep, False)
    return rows.filter(keep), names.filter(keep), pc.struct_field(items, "value").filter(keep).cast(pa.float64())


def _flags(frame: pl.DataFrame) -> pl.DataFrame:
    """+ row (a key for joins: rollout ids may repeat across sources) and carried (the rollout itself failed)."""
    boundary = pl.col("error").struct.field("boundary")
    carried = boundary.is_not_null() & (boundary != RESCORED_BOUNDARY)
    return frame.with_row_index("row").with_columns(carried=carried.fill_null(False))


def long_form(frame: pl.DataFrame) -> pl.DataFrame:
    """One line per row and component (total `*` included): rollout_id, env, component, old, new, changed."""
    total = frame.select("rollout_id", "env", pl.lit(TOTAL).alias("component"), pl.col("reward").alias("old"),
                         pl.col("rescore_reward").alias("new"))
    scored = frame.filter(~pl.col("carried"))
    old, new = _components(scored, "metrics", "old"), _components(scored, "rescore_metrics", "new")
    parts = old.join(new, on=["row", "rollout_id", "env", "component"], how="full", coalesce=True).drop("row")
    both = pl.concat([total, parts.select(total.columns)], how="vertical_relaxed")
    return both.with_columns(changed=changed(pl.col("old"), pl.col("new")))


def _components(frame: pl.DataFrame, column: str, side: str) -> pl.DataFrame:
    return (frame.select("row", "rollout_id", "env", pl.col(column).alias("m")).explode("m").drop_nulls("m")
            .unnest("m").filter(pl.col("name").str.starts_with(PREFIX))
            .select("row", "rollout_id", "env", pl.col("name").str.strip_prefix(PREFIX).alias("component"),
                    pl.col("value").cast(pl.Float64).alias(side)))


def _empty() -> Diff:
    f64, i64, s = pl.Float64, pl.Int64, pl.String
    return Diff(
        pl.DataFrame(schema={"env": s, "component": s, "rows": i64, "changed": i64, "mean_old": f64, "mean_new": f64,
                             "max_abs_delta": f64}),
        pl.DataFrame(schema={"rollout_id": s, "env": s, "component": s, "old": f64, "new": f64}),
        pl.DataFrame(schema={"env": s, **{k: i64 for k in ("rows", "rescored", "carried", "stored_errors",
                                                            "null_rewards", "rescore_errors", "changed")}}),
        pl.DataFrame(schema={"env": s, "old": f64, "new": f64, "rows": i64}))


def plot_diff(diff: Diff, path: str | Path, title: str = "re-score") -> Path:
    """Stored vs re-scored total reward, one panel per env (from a Diff or a RescoreResult).

    A point's area grows with its number of rows; points off the diagonal (changed) are orange.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = diff.counts["env"].to_list() or ["(no rows)"]
    cols = min(len(envs), 4)
    rows = -(-len(envs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols + 0.6, 3.1 * rows + 0.6), squeeze=False)
    for ax, env in zip(axes.flat, envs):
        points = diff.pairs.filter(pl.col("env") == env)
        count = diff.counts.filter(pl.col("env") == env)
        low = min([0.0, *points["old"].to_list(), *points["new"].to_list()])
        high = max([1.0, *points["old"].to_list(), *points["new"].to_list()])
        ax.plot([low, high], [low, high], color="0.75", linewidth=1, zorder=0)
        if len(points):
            area = (points["rows"] / points["rows"].max() * 300 + 12).to_list()
            moved = ["tab:orange" if abs(o - n) > TOL else "tab:blue" for o, n in points.select("old", "new").rows()]
            ax.scatter(points["old"], points["new"], s=area, c=moved, alpha=0.6)
        changed_rows = int(count["changed"][0]) if len(count) else 0
        total = int(count["rows"][0]) if len(count) else 0
        ax.set_title(f"{plain(env)}: {changed_rows} of {total} changed", fontsize=9)
        ax.set_xlabel("stored reward")
        ax.set_ylabel("re-scored reward")
    for ax in list(axes.flat)[len(envs):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
