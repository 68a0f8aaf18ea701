"""Re-score stored rollouts with any verifier version, in parallel over cores; write them back with a diff.

    result = rescore("runs/r1")                                            # each env's current verifier
    result = rescore("runs/r1", verifier="my_envs/arith_v2.py", out="runs/r1-v2")
    result = rescore(["org/rollouts@3f1c2e9:r1"], env_revision="org/arith@9e1f0aa", pin="sha256:...")
    result.diff, result.changes, result.counts                             # polars frames (see diff.py)

No model and no tool runs: a stored row holds the prompt, completion, info and interaction its
verifier reads, and verifiers are pure, so work is done by a process pool in any order and put
back in input order. Local shard files go to the workers by path: each worker checks, scores and
writes whole shards (shards.rescore_shard; one output shard per input shard) and sends back only
the diff's columns. Hub streams and record batches go to them batch by batch (one output shard
per batch of at most 512 rows). At most 2 x workers pieces are in flight: memory stays bounded
however many rows stream through. Output shards (if `out`) keep every column and add the
`rescore_*` columns of scoring.RESCORE_SCHEMA; re-scoring a re-scored folder replaces those columns.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from hubgym.errors import NoShardsError, ShardError, SkippedShardsWarning
from hubgym.hub.shards import LoadedShard, ShardSource, load_shard
from hubgym.score.choice import PinArg, RevisionArg, VerifierArg, VerifierChoice, VerifierSpec
from hubgym.score.diff import Tally, plot_diff
from hubgym.score.output import RescoreOutput
from hubgym.score.scoring import score_batch, score_ipc, slim, to_ipc
from hubgym.score.shards import ShardResult, check_columns, diff_rows, rescore_shard, with_scores, write_shard
from hubgym.score.sources import Source, open_source
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
    tally, run_ids = Tally(background=True), set()
    with scorer or Scorer(workers, stored.rows) as scorer:
        if stored.shards is not None:  # local shard files: workers read them themselves
            parts = _shard_parts(scorer, choice, stored.shards, output, skip_bad)
        else:  # a hub stream or record batches: batches go to the workers
            parts = _batch_parts(scorer, choice, stored.batches, output)
        for part in parts:
            if part.diff_rows is not None:
                tally.add(part.diff_rows)
            run_ids.update(part.run_ids)
            if progress:
                progress(part.rows, stored.rows)
    diff = tally.result()
    result = RescoreResult(int(diff.counts["rows"].sum()), int(diff.counts["changed"].sum()), diff.summary,
                           diff.changes, diff.counts, diff.pairs, dict(choice.specs), choice.unused(),
                           output.shards() if output else [], None, 0.0)
    result.seconds = time.perf_counter() - started
    if output:
        result.manifest = output.finish(_run_id(run_ids), _record(result, stored.names, verifier, env_revision),
                                        _envs(result.verifiers))
    return result


def _shard_parts(scorer: "Scorer", choice: VerifierChoice, shards: list[ShardSource], output: RescoreOutput | None,
                 skip_bad: bool) -> Iterator[ShardResult]:
    """Each shard's result, in input order, with at most `scorer.depth()` shards in flight; a shard holding an env
    no verifier was resolved for yet comes back unscored (`missing`) and is scored again once it is."""
    specs: dict[str, VerifierSpec] = {}
    target = (lambda index: output.path(index)) if output else (lambda index: None)
    pending: deque[tuple[int, ShardSource, Future]] = deque()
    bad: list[str] = []

    def finished(index: int, shard: ShardSource, future: Future) -> ShardResult | None:
        part = future.result()
        while part.missing:
            specs.update({env: choice.spec(env) for env in part.missing})
            part = scorer.shard(shard, dict(specs), target(index)).result()
        if part.error is not None:
            if not skip_bad:
                raise ShardError(part.error, shard=part.shard)
            bad.append(part.shard)
            return None
        if output and part.output:
            output.record(part.output)
        return part

    ahead = _Prefetch(shards)
    try:
        for index, shard in enumerate(shards):
            here = isinstance(scorer, Scorer) and not scorer.pooled()  # another scorer (a cluster's) works elsewhere
            work = ahead.loaded(index) if here else shard  # here: the next one is checked in a thread meanwhile
            pending.append((index, shard, scorer.shard(work, dict(specs), target(index))))
            while len(pending) >= scorer.depth():
                if (part := finished(*pending.popleft())) is not None:
                    yield part
        while pending:
            if (part := finished(*pending.popleft())) is not None:
                yield part
    finally:
        ahead.close()
    if bad:
        warnings.warn(SkippedShardsWarning(f"skipped {len(bad)} bad shard(s) (of {len(shards)} in this read): "
                                           f"{', '.join(bad)}"), stacklevel=3)
        if len(bad) == len(shards):
            raise NoShardsError(f"every one of the {len(shards)} shard(s) read is bad (named in the note above); "
                                f"re-run the rollout that wrote them, or read another source")


class _Prefetch:
    """Shards loaded and checked (`load_shard`: the sha256 hashing is most of it) one ahead, in a thread, while
    this process scores the current one (hashing releases the GIL)."""

    def __init__(self, shards: list[ShardSource]):
        self.shards, self.pool, self.next = shards, None, None

    def loaded(self, index: int) -> LoadedShard | ShardSource:
        """Shard `index` loaded (or its source, to be loaded again where its error is reported)."""
        future = self.next if self.next is not None and self.next[0] == index else None
        loaded = future[1].result() if future else _load(self.shards[index])
        self.next = None
        if index + 1 < len(self.shards):
            self.pool = self.pool or ThreadPoolExecutor(1, thread_name_prefix="hubgym-rescore")
            self.next = (index + 1, self.pool.submit(_load, self.shards[index + 1]))
        else:
            self.close()
        return loaded

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


def _load(shard: ShardSource) -> LoadedShard | ShardSource:
    try:
        return load_shard(shard)
    except ShardError:
        return shard


def _batch_parts(scorer: "Scorer", choice: VerifierChoice, batches: Iterator[pa.RecordBatch],
                 output: RescoreOutput | None) -> Iterator[ShardResult]:
    """Each stored batch's result (its output shard written here), in input order."""
    pending: deque[tuple[pa.RecordBatch, Future]] = deque()

    def finished(batch: pa.RecordBatch, future: Future) -> ShardResult:
        table = with_scores(batch, future.result())
        if output:
            output.record(write_shard(output.path(len(output.files)), [table]))
        return ShardResult("", batch.num_rows, diff_rows=diff_rows([table]),
                           run_ids=set(pc.unique(batch.column("run_id")).to_pylist()))

    for number, batch in enumerate(batches):
        check_columns(batch, f"record batch {number} of the source")
        specs = {env: choice.spec(env) for env in pc.unique(batch.column("env")).to_pylist()}
        pending.append((batch, scorer.batch(specs, slim(batch))))
        while len(pending) >= scorer.depth():
            yield finished(*pending.popleft())
    while pending:
        yield finished(*pending.popleft())


class Scorer:
    """Runs re-scoring work (a local shard, or a slim batch) in this process, or in a process pool.

    A pool's workers fork from a forkserver: a clean process that imported the scoring code once
    (plain fork would copy this process's threads: vLLM's, torch's, Arrow's; spawn would import
    everything again in every worker). Starting one costs a second or more, so the pool is kept for
    the next re-score in this process (`POOLS`), and with `workers=None` the first piece of work is
    done here, and a pool of every core starts only if the rows left would take longer than
    POOL_WORTH_S in one process (or longer than WARM_POOL_WORTH_S when a pool is already running).
    """

    POOL_WORTH_S = 2.0
    WARM_POOL_WORTH_S = 0.05

    def __init__(self, workers: int | None, total_rows: int | None):
        self.auto, self.workers = workers is None, workers or os.cpu_count() or 1
        self.total, self.rows, self.seconds = total_rows, 0, 0.0
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.pool is not None and exc_type is not None:  # a failed re-score leaves no work behind
            POOLS.pop(_key(self.workers), None)
            self.pool.shutdown(cancel_futures=True)

    def depth(self) -> int:
        return 2 * self.workers if self.pool is not None else 1

    def pooled(self) -> bool:
        """Whether the next piece of work goes to the pool (starting it, if it is now worth it)."""
        return self._use_pool()

    def shard(self, shard: ShardSource | LoadedShard, specs: dict[str, VerifierSpec], out: Path | None) -> Future:
        """rescore_shard(shard, specs, out), here or in the pool."""
        return self._run(rescore_shard, (shard, specs, out), lambda part: part.rows if part.done else 0)

    def batch(self, specs: dict[str, VerifierSpec], batch: pa.RecordBatch) -> Future:
        """The new columns of a slim batch, here or in the pool (sent as Arrow IPC bytes)."""
        if self._use_pool():
            return self.pool.submit(score_ipc, specs, to_ipc(batch))
        return self._here(score_batch, (specs, batch), lambda _: batch.num_rows)

    def _run(self, work, args: tuple, rows) -> Future:
        if self._use_pool():
            return self.pool.submit(work, *args)
        return self._here(work, args, rows)

    def _here(self, work, args: tuple, rows) -> Future:
        started, future = time.perf_counter(), Future()
        result = work(*args)
        future.set_result(result)
        self.rows, self.seconds = self.rows + rows(result), self.seconds + time.perf_counter() - started
        return future

    def _use_pool(self) -> bool:
        if self.pool is None and self.workers > 1 and self._worth_a_pool():
            self.pool = POOLS.get(_key(self.workers))
            if self.pool is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(["hubgym.score.shards"])
                self.pool = POOLS[_key(self.workers)] = ProcessPoolExecutor(self.workers, mp_context=context)
        return self.pool is not None

    def _worth_a_pool(self) -> bool:
        if not self.auto:
            return True
        if self.rows == 0:  # score here first, to learn what a row costs
            return False
        worth = self.WARM_POOL_WORTH_S if _key(self.workers) in POOLS else self.POOL_WORTH_S
        return self.total is None or (self.total - self.rows) * self.seconds / self.rows > worth


POOLS: dict[tuple[int, int], ProcessPoolExecutor] = {}  # (process id, workers) -> a pool kept for the next re-score


def _key(workers: int) -> tuple[int, int]:
    """A pool belongs to the process that started it: a forked child (a data loader's) never uses or stops it."""
    return os.getpid(), workers


@atexit.register
def _close_pools() -> None:
    for (pid, _), pool in list(POOLS.items()):
        if pid == os.getpid():
            pool.shutdown(cancel_futures=True)
    POOLS.clear()


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
