"""Re-score stored rollouts, in parallel over cores, and write them back with the new rewards.

The verifier is the env's current one (by the `env` of each row), a module (`verifier=`: a
file path or an importable name) or the verifier of a hub env revision (`env_revision=`, run
only when pinned or trusted). Output shards keep every original column and add
`rescore_reward`, `rescore_metrics`, `rescore_error`, `rescore_verifier_module` and
`rescore_verifier_sha256`; `diff` compares the old and new rewards per env and per component.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import polars as pl
import pyarrow as pa

from hubgym.fileio import atomic_write_bytes
from hubgym.hub.rollouts import decode_row, iter_rollout_batches
from hubgym.verifiers.contract import Verifier

TASK_COLUMNS = ["rollout_id", "task_id", "env", "prompt", "completion", "info", "interaction", "reward", "metrics",
                "error"]
NEW_FIELDS = [
    pa.field("rescore_reward", pa.float64()),
    pa.field("rescore_metrics", pa.list_(pa.struct([("name", pa.string()), ("value", pa.float64())]))),
    pa.field("rescore_error", pa.string()),
    pa.field("rescore_verifier_module", pa.string()),
    pa.field("rescore_verifier_sha256", pa.string()),
]


@dataclass
class RescoreResult:
    rows: int
    changed: int  # rows whose reward changed (a reward that appeared or vanished counts)
    diff: pl.DataFrame  # env, component, rows, changed, mean_old, mean_new, max_abs_delta
    shards: list[Path]
    seconds: float
    verifiers: dict[str, str]  # env -> "module sha256[:12]" used


@dataclass(frozen=True)
class VerifierChoice:
    """Which verifier scores a row: picklable, so worker processes resolve it themselves."""

    module: str | None = None
    env_revision: str | None = None
    hub: str | None = None
    trust: bool = False
    pin: str | None = None

    def for_env(self, env: str) -> Verifier:
        return _resolve(self, env)


@lru_cache(maxsize=64)
def _resolve(choice: VerifierChoice, env: str) -> Verifier:
    if choice.module:
        from hubgym.verifiers.contract import load_verifier

        return load_verifier(choice.module, env=env)
    if choice.env_revision:
        from hubgym.hub.load import load_env

        return load_env(choice.env_revision, trust=choice.trust, pin=choice.pin, hub=choice.hub).verifier
    from hubgym.builders.registry import resolve_env

    return resolve_env(env).verifier()


def score_rows(choice: VerifierChoice, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """New reward, components and error of each row (runs in a worker process)."""
    out = []
    for row in rows:
        verifier = choice.for_env(row["env"])
        task = {"id": row["task_id"], "env": row["env"], "prompt": row["prompt"], "info": row["info"],
                "interaction": row["interaction"]}
        score = verifier.score(task, row["completion"])
        error = score.error
        out.append({
            "rescore_reward": None if error else score.reward,
            "rescore_metrics": [{"name": f"reward/{k}", "value": float(v)} for k, v in score.components.items()],
            "rescore_error": f"{error['type']}: {error['message']}" if error else None,
            "rescore_verifier_module": verifier.name, "rescore_verifier_sha256": verifier.sha256,
        })
    return out


def rescore(sources: list[str | Path], *, verifier: str | None = None, env_revision: str | None = None,
            out: str | Path | None = None, workers: int | None = None, hub: str | None = None, trust: bool = False,
            pin: str | None = None, progress=None) -> RescoreResult:
    """Re-score every row of `sources`; write shards under `out` (if given); return the diff."""
    started = time.perf_counter()
    choice = VerifierChoice(verifier, env_revision, None if hub is None else str(hub), trust, pin)
    workers = workers or os.cpu_count() or 1
    out_dir = Path(out) / "shards" if out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    shards, compared = [], []
    batches = iter_rollout_batches(list(sources), hub=hub)
    with ProcessPoolExecutor(workers) if workers > 1 else _Inline() as pool:
        for i, (batch, scores) in enumerate(_scored(pool, choice, batches, workers)):
            table = _with_scores(batch, scores)
            compared.append(table.select(["env", "reward", "metrics", "rescore_reward", "rescore_metrics",
                                          "rescore_verifier_module", "rescore_verifier_sha256"]))
            if out_dir:
                shards.append(_write(out_dir / f"rescored-{i:05d}.arrow", table))
            if progress:
                progress(batch.num_rows)
    frame = pl.from_arrow(pa.concat_tables(compared)) if compared else pl.DataFrame()
    diff = diff_table(frame) if len(frame) else pl.DataFrame()
    changed = int(_changed(frame).sum()) if len(frame) else 0
    used = {r["env"]: f"{r['rescore_verifier_module']} {str(r['rescore_verifier_sha256'])[:12]}"
            for r in frame.unique("env").iter_rows(named=True)} if len(frame) else {}
    return RescoreResult(len(frame), changed, diff, shards, time.perf_counter() - started, used)


def _scored(pool, choice: VerifierChoice, batches: Iterator[pa.RecordBatch], workers: int):
    """(batch, scores) in input order, with up to 2 x workers batches in flight (bounded memory)."""
    pending = []
    for batch in batches:
        rows = [decode_row(r) for r in batch.select(TASK_COLUMNS).to_pylist()]
        pending.append((batch, pool.submit(score_rows, choice, rows)))
        if len(pending) >= 2 * workers:
            done, future = pending.pop(0)
            yield done, future.result()
    for done, future in pending:
        yield done, future.result()


def _with_scores(batch: pa.RecordBatch, scores: list[dict[str, Any]]) -> pa.Table:
    table = pa.Table.from_batches([batch])
    for field in NEW_FIELDS:
        table = table.append_column(field, pa.array([s[field.name] for s in scores], field.type))
    return table


def _write(path: Path, table: pa.Table) -> Path:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())
    return path


def _changed(frame: pl.DataFrame) -> pl.Series:
    old, new = frame["reward"], frame["rescore_reward"]
    return ((old - new).abs().fill_null(0.0) > 1e-9) | (old.is_null() != new.is_null())


def diff_table(frame: pl.DataFrame) -> pl.DataFrame:
    """Per env: the total reward (component `*`) and each named component, old vs new."""
    total = frame.select("env", pl.lit("*").alias("component"), pl.col("reward").alias("old"),
                         pl.col("rescore_reward").alias("new"))
    parts = []
    for side, column in (("old", "metrics"), ("new", "rescore_metrics")):
        exploded = (frame.with_row_index("row").select("row", "env", column).explode(column)
                    .drop_nulls(column).unnest(column).filter(pl.col("name").str.starts_with("reward/"))
                    .select("row", "env", pl.col("name").str.strip_prefix("reward/").alias("component"),
                            pl.col("value").alias(side)))
        parts.append(exploded)
    components = parts[0].join(parts[1], on=["row", "env", "component"], how="full", coalesce=True).drop("row")
    both = pl.concat([total, components.select("env", "component", "old", "new")], how="vertical_relaxed")
    delta = (pl.col("old") - pl.col("new")).abs()
    changed = (delta.fill_null(0.0) > 1e-9) | (pl.col("old").is_null() != pl.col("new").is_null())
    return (both.group_by("env", "component")
            .agg(pl.len().alias("rows"), changed.sum().alias("changed"), pl.col("old").mean().alias("mean_old"),
                 pl.col("new").mean().alias("mean_new"), delta.max().alias("max_abs_delta"))
            .sort("env", "component"))


def plot_diff(result: RescoreResult, path: str | Path) -> Path:
    """Mean old vs new reward per env and component, as grouped bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    diff = result.diff
    labels = [f"{r['env']}\n{r['component']}" for r in diff.iter_rows(named=True)]
    x = range(len(labels))
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(labels) + 2), 3.6))
    ax.bar([i - 0.2 for i in x], diff["mean_old"].fill_null(0).to_list(), width=0.4, label="stored")
    ax.bar([i + 0.2 for i in x], diff["mean_new"].fill_null(0).to_list(), width=0.4, label="re-scored")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("mean reward")
    ax.set_title(f"re-score: {result.changed} of {result.rows} rows changed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


class _Inline:
    """A one-process stand-in for ProcessPoolExecutor (workers=1): same interface, no pickling."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        from concurrent.futures import Future

        future: Future = Future()
        future.set_result(fn(*args))
        return future
