"""Re-score stored rollouts with any verifier version, in parallel over cores; write them back with a diff.

    result = rescore("runs/r1")                                            # each env's current verifier
    result = rescore("runs/r1", verifier="my_envs/arith_v2.py", out="runs/r1-v2")
    result = rescore(["org/rollouts@3f1c2e9:r1"], env_revision="org/arith@9e1f0aa", pin="sha256:...")
    result.diff, result.changes, result.counts                             # polars frames (see diff.py)

No model and no tool runs: a stored row holds the prompt, completion, info and interaction its
verifier reads, and verifiers are pure, so batches are scored by a process pool in any order and
put back in input order. At most 2 x workers batches are in flight: memory stays bounded however
many rows stream through. Output shards (if `out`) keep every column and add the `rescore_*`
columns of scoring.RESCORE_SCHEMA; re-scoring a re-scored folder replaces those columns.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from hubgym.errors import ShardError
from hubgym.score.choice import PinArg, RevisionArg, VerifierArg, VerifierChoice, VerifierSpec
from hubgym.score.diff import Tally, plot_diff
from hubgym.score.output import RescoreOutput
from hubgym.score.scoring import RESCORE_SCHEMA, SCORED_COLUMNS, score_batch, score_ipc, slim, to_ipc
from hubgym.score.sources import Source, open_source

REQUIRED = sorted({*SCORED_COLUMNS, "rollout_id", "run_id", "reward", "metrics"})
Progress = Callable[[int, "int | None"], None]  # (rows just re-scored, total rows if known)

__all__ = ["RescoreResult", "plot_diff", "rescore"]


@dataclass
class RescoreResult:
    rows: int
    changed: int  # rows whose total reward changed (moved, appeared or vanished)
    diff: pl.DataFrame  # per env and component (`*` = total): rows, changed, mean_old, mean_new, max_abs_delta
    changes: pl.DataFrame  # every (rollout_id, env, component) that changed, with old and new values
    counts: pl.DataFrame  # per env: rows, rescored, carried, stored_errors, null_rewards, rescore_errors, changed
    pairs: pl.DataFrame  # (env, old, new, rows): stored vs new total rewards, for plot_diff
    verifiers: dict[str, VerifierSpec]  # env -> the verifier that scored its rows
    unused: list[str]  # verifiers asked for that matched no row (e.g. --verifier ENV=... for an absent env)
    shards: list[Path]
    manifest: Path | None
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / max(self.seconds, 1e-9)


def rescore(source: Source, *, verifier: VerifierArg = None, env_revision: RevisionArg = None,
            out: str | Path | None = None, workers: int | None = None, trust: bool = False, pin: PinArg = None,
            hub=None, progress: Progress | None = None, skip_bad: bool = False,
            scorer: "Scorer | None" = None) -> RescoreResult:
    """Re-score every row of `source` (run folders, shard files, hub refs or record batches).

    verifier: `MODULE` (the rows' one env), `ENV=MODULE` (repeatable) or {env: module}; other envs
    keep their current verifier. env_revision: `org/name@rev` (or several), whose verifier scores rows of its
    env (runs only if pinned by `pin`, `REPO=sha256:...` per repo, or `trust`); one source per env. workers: processes (1 = in-process; default: every core
    when the work is worth starting a pool, see Scorer). skip_bad: leave out shards that fail their checks
    (one SkippedShardsWarning names them) instead of raising ShardError at the first. scorer: what scores the
    batches instead of this machine's Scorer (same submit/depth; e.g. hubgym.cluster.ray_score's RayScorer).
    """
    started = time.perf_counter()
    choice = VerifierChoice(verifier, env_revision, trust=trust, pin=pin, hub=hub)
    stored = open_source(source, hub=hub, skip_bad=skip_bad)
    output = RescoreOutput(out, stored.local) if out is not None else None
    tally, run_ids = Tally(), set()
    with scorer or Scorer(workers, stored.rows) as scorer:
        for batch, scores in _in_order(scorer, choice, stored.batches):
            table = with_scores(batch, scores)
            tally.add(table)
            run_ids.update(pc.unique(batch.column("run_id")).to_pylist())
            if output:
                output.write(table)
            if progress:
                progress(batch.num_rows, stored.rows)
    diff = tally.result()
    result = RescoreResult(int(diff.counts["rows"].sum()), int(diff.counts["changed"].sum()), diff.summary,
                           diff.changes, diff.counts, diff.pairs, dict(choice.specs), choice.unused(),
                           output.shards() if output else [], None, 0.0)
    result.seconds = time.perf_counter() - started
    if output:
        result.manifest = output.finish(_run_id(run_ids), _record(result, stored.names, verifier, env_revision),
                                        _envs(result.verifiers))
    return result


def with_scores(batch: pa.RecordBatch, scores: pa.RecordBatch) -> pa.Table:
    """The stored batch (minus any earlier rescore_* columns) + the new columns."""
    keep = [name for name in batch.schema.names if name not in RESCORE_SCHEMA.names]
    columns = [batch.column(name) for name in keep] + scores.columns
    fields = [batch.schema.field(name) for name in keep] + list(RESCORE_SCHEMA)
    return pa.Table.from_batches([pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))])


def _in_order(scorer: "Scorer", choice: VerifierChoice,
              batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[pa.RecordBatch, pa.RecordBatch]]:
    """(stored batch, new columns) in input order, with at most `scorer.depth()` batches in flight."""
    pending: deque[tuple[pa.RecordBatch, Future]] = deque()
    for number, batch in enumerate(batches):
        _check_columns(batch, number)
        specs = {env: choice.spec(env) for env in pc.unique(batch.column("env")).to_pylist()}
        pending.append((batch, scorer.submit(specs, slim(batch))))
        while len(pending) >= scorer.depth():
            done, future = pending.popleft()
            yield done, future.result()
    while pending:
        done, future = pending.popleft()
        yield done, future.result()


class Scorer:
    """Scores slim batches in this process, or in a process pool.

    A pool's workers fork from a forkserver: a clean process that imported the scoring code once
    (plain fork would copy this process's threads: vLLM's, torch's, Arrow's; spawn would import
    everything again in every worker). Starting one costs a second or more, so with `workers=None`
    the first batch is scored here, and a pool of every core starts only if the rows left would
    take longer than POOL_WORTH_S in one process.
    """

    POOL_WORTH_S = 2.0

    def __init__(self, workers: int | None, total_rows: int | None):
        self.auto, self.workers = workers is None, workers or os.cpu_count() or 1
        self.total, self.rows, self.seconds = total_rows, 0, 0.0
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def depth(self) -> int:
        return 2 * self.workers if self.pool is not None else 1

    def submit(self, specs: dict[str, VerifierSpec], batch: pa.RecordBatch) -> Future:
        if self.pool is None and self.workers > 1 and self._worth_a_pool():
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["hubgym.score.scoring"])
            self.pool = ProcessPoolExecutor(self.workers, mp_context=context)
        if self.pool is not None:
            return self.pool.submit(score_ipc, specs, to_ipc(batch))
        started, future = time.perf_counter(), Future()
        future.set_result(score_batch(specs, batch))
        self.rows, self.seconds = self.rows + batch.num_rows, self.seconds + time.perf_counter() - started
        return future

    def _worth_a_pool(self) -> bool:
        if not self.auto:
            return True
        if self.rows == 0:  # score one batch here first, to learn what a row costs
            return False
        return self.total is None or (self.total - self.rows) * self.seconds / self.rows > self.POOL_WORTH_S


def _check_columns(batch: pa.RecordBatch, number: int) -> None:
    missing = [name for name in REQUIRED if batch.schema.get_field_index(name) < 0]
    if missing:
        raise ShardError(f"record batch {number} of the source lacks the rollout column(s) {', '.join(missing)}; "
                         f"re-score reads shards written by `hubgym rollout` (hubgym's ShardWriter)")


def _run_id(run_ids: set) -> str:
    """The output's run id: the stored run's id + '-rescored' when the rows come from one run."""
    return f"{next(iter(run_ids))}-rescored" if len(run_ids) == 1 else "rescored"


def _record(result: RescoreResult, sources: list[str], verifier: VerifierArg, env_revision: RevisionArg) -> dict:
    return {
        "sources": sources, "verifier": verifier, "env_revision": env_revision, "rows": result.rows,
        "changed": result.changed, "seconds": round(result.seconds, 3), "counts": result.counts.to_dicts(),
        "verifiers": {env: {"module": s.module, "sha256": s.sha256, "origin": s.origin}
                      for env, s in sorted(result.verifiers.items())},
    }


def _envs(verifiers: dict[str, VerifierSpec]) -> dict[str, dict]:
    """The manifest's `envs`, as a rollout run's manifest has them (the verifier is the new one)."""
    return {env: {"verifier_module": s.module, "verifier_sha256": s.sha256,
                  "env_repo": s.origin.partition("@")[0] if "@" in s.origin else None,
                  "env_revision": s.origin.partition("@")[2] or None}
            for env, s in sorted(verifiers.items())}
