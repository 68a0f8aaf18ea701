"""Re-score stored rollouts with any verifier version, in parallel over cores; write them back with a diff.

    result = rescore("runs/r1")                                            # each env's current verifier
    result = rescore("runs/r1", verifier="my_envs/arith_v2.py", out="runs/r1-v2")
    result = rescore(["org/rollouts@3f1c2e9:r1"], env_revision="org/arith@9e1f0aa", pin="sha256:...")
    result.diff, result.changes, result.counts                             # polars frames (see diff.py)

No model and no tool runs: a stored row holds the prompt, completion, info and interaction its
verifier reads, and verifiers are pure, so work is done by a process pool in any order and put
back in input order. Local shard files go to the workers by path, in bundles of consecutive shards
of about 4096 rows: each worker checks, scores and writes whole shards (shards.rescore_shards; one
output shard per input shard) and sends back only the diff's columns. Hub streams and record
batches go to them batch by batch (one output shard per batch of at most 512 rows). At most
2 x workers pieces (bundles or batches) are in flight: memory stays bounded however many rows
stream through. Output shards (if `out`) keep every column and add the
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

from hubgym.errors import NoShardsError, ShardError
from hubgym.hub.shard_checks import SeenRollouts
from hubgym.hub.shards import LoadedShard, ShardSource, fetch_or_error, open_or_error, shard_rows, skipped_warning
from hubgym.score.choice import PinArg, RevisionArg, VerifierArg, VerifierChoice, VerifierSpec
from hubgym.score.diff import Tally, plot_diff
from hubgym.score.output import RescoreOutput
from hubgym.score.scoring import score_batch, score_ipc, slim, to_ipc
from hubgym.score.shards import (GROUP_ROWS, ShardResult, check_columns, diff_rows, rescore_shards, with_scores,
                                 write_shard)
from hubgym.score.stored import Source, StoredRollouts, open_source
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
    env (runs only if pinned by `pin`, `REPO=sha256:...` per repo, or `trust`); one source per env.
    workers: processes (1 = in-process; default: every core when the work is worth starting a pool, see
    Scorer). skip_bad: leave out shards that fail their checks
    (one SkippedShardsWarning names them) instead of raising ShardError at the first. scorer: what scores the
    batches instead of this machine's Scorer (same submit/depth; e.g. hubgym.cluster.ray_score's RayScorer).
    """
    started = time.perf_counter()
    choice = VerifierChoice(verifier, env_revision, trust=trust, pin=pin, hub=hub)
    stored = open_source(source, hub=hub, skip_bad=skip_bad)
    output = RescoreOutput(out, stored.local) if out is not None else None
    try:
        result, run_ids = _score_all(stored, choice, output, scorer or Scorer(workers, stored.rows), skip_bad,
                                     progress)
        result.seconds = time.perf_counter() - started
        if output:
            result.manifest = output.finish(_run_id(run_ids), _record(result, stored.names, verifier, env_revision),
                                            _envs(result.verifiers), run_ids=sorted(run_ids))
    finally:
        if output:
            output.close()  # a failed or stopped re-score leaves no output shard behind
    return result


def _score_all(stored: StoredRollouts, choice: VerifierChoice, output: RescoreOutput | None, scorer: "Scorer",
               skip_bad: bool, progress: Progress | None) -> tuple[RescoreResult, set]:
    """Every row of `stored` scored (output shards staged), its diff, and the run ids the rows came from."""
    tally, run_ids = Tally(background=True), set()
    with scorer:
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
    return RescoreResult(int(diff.counts["rows"].sum()), int(diff.counts["changed"].sum()), diff.summary,
                         diff.changes, diff.counts, diff.pairs, dict(choice.specs), choice.unused(),
                         output.shards() if output else [], None, 0.0), run_ids


def _shard_parts(scorer: "Scorer", choice: VerifierChoice, shards: list[ShardSource], output: RescoreOutput | None,
                 skip_bad: bool) -> Iterator[ShardResult]:
    """Each shard's result, in input order. Shards go to the scorer in bundles (consecutive shards of about
    GROUP_ROWS rows, scored together), at most `scorer.depth()` bundles in flight; a bundle holding an env no
    verifier was resolved for yet comes back unscored (`missing`) and is scored again once it is."""
    specs: dict[str, VerifierSpec] = {}
    target = (lambda index: output.path(index)) if output else (lambda index: None)
    pending: deque[tuple[list[int], Future]] = deque()
    bad: list[tuple[str, int | None, ShardError]] = []  # (shard, rows, what broke)
    seen = SeenRollouts()  # a rollout id two shards hold: the second is a bad shard

    def finished(indices: list[int], future: Future) -> Iterator[ShardResult]:
        parts = future.result()
        while missing := sorted({env for part in parts for env in part.missing}):
            specs.update({env: choice.spec(env) for env in missing})
            parts = scorer.shards([shards[i] for i in indices], dict(specs), [target(i) for i in indices]).result()
        for index, part in zip(indices, parts):
            if part.error is None and part.diff_rows is not None:
                part.error = _repeated(seen, part, target(index))
            if part.error is not None:
                column, row, rule = part.broke or (None, None, None)
                error = ShardError(part.error, shard=part.shard, column=column, row=row, rule=rule)
                if not skip_bad:
                    raise error
                bad.append((part.shard, shard_rows(shards[index]), error))
                continue
            if output and part.output:
                output.record(part.output)
            yield part

    ahead = _Prefetch(shards)
    try:
        index = 0
        while index < len(shards):
            here = isinstance(scorer, Scorer) and not scorer.pooled()  # another scorer (a cluster's) works elsewhere
            indices = _bundle(shards, index, scorer.bundle_rows())
            # here: the next bundle is read and hashed in a thread meanwhile
            work = ahead.loaded(indices) if here else [shards[i] for i in indices]
            pending.append((indices, scorer.shards(work, dict(specs), [target(i) for i in indices])))
            index = indices[-1] + 1
            while len(pending) >= scorer.depth():
                yield from finished(*pending.popleft())
        while pending:
            yield from finished(*pending.popleft())
    finally:
        ahead.close()
    if bad:
        warnings.warn(skipped_warning(bad, len(shards)), stacklevel=3)
        if len(bad) == len(shards):
            raise NoShardsError(f"every one of the {len(shards)} shard(s) read is bad (named in the note above); "
                                f"re-run the rollout that wrote them, or read another source")


def _repeated(seen: SeenRollouts, part: ShardResult, output: Path | None) -> str | None:
    """The error of a shard that repeats a rollout an earlier shard held (its output shard, written by then, is
    removed), or None."""
    try:
        seen.add(part.shard, part.diff_rows.column("rollout_id").to_pylist())
    except ShardError as exc:
        if output is not None:
            output.unlink(missing_ok=True)
        return str(exc)
    return None


def _bundle(shards: list[ShardSource], start: int, rows: int) -> list[int]:
    """Indices of the consecutive shards from `start` holding at most `rows` rows together (at least one shard;
    a shard whose rows nothing recorded goes alone)."""
    indices, total = [start], shards[start].rows or rows
    while (nxt := indices[-1] + 1) < len(shards) and shards[nxt].rows and total + shards[nxt].rows <= rows:
        indices.append(nxt)
        total += shards[nxt].rows
    return indices


class _Prefetch:
    """The next bundle's shards read and hashed in a thread (`fetch_shard`: hashlib and the reading release the
    GIL, and the thread runs almost no Python) while this process scores the current bundle; each is opened and
    checked here (`open_fetched`), when it is used. Checking it in the thread would cost more than it saves:
    that Python work would take the GIL from the scoring over and over."""

    def __init__(self, shards: list[ShardSource]):
        self.shards, self.pool, self.futures = shards, None, {}

    def loaded(self, indices: list[int]) -> list[LoadedShard | ShardSource]:
        """Shards `indices` loaded (or their sources, loaded again where their errors are reported); then as
        many shards after them start loading."""
        fetched = [self.futures.pop(i).result() if i in self.futures else fetch_or_error(self.shards[i])
                   for i in indices]
        ahead = range(indices[-1] + 1, min(indices[-1] + 1 + len(indices), len(self.shards)))
        if len(ahead):
            self.pool = self.pool or ThreadPoolExecutor(1, thread_name_prefix="hubgym-rescore")
            self.futures.update({i: self.pool.submit(fetch_or_error, self.shards[i])
                                 for i in ahead if i not in self.futures})
        else:
            self.close()
        loaded = [open_or_error(one) for one in fetched]
        return [self.shards[i] if isinstance(one, ShardError) else one for i, one in zip(indices, loaded)]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


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

    def bundle_rows(self) -> int:
        """Rows of the shards scored together: GROUP_ROWS, or fewer when a pool would otherwise get fewer than
        4 bundles per worker (a small re-score still spreads over every core)."""
        if self.pool is None or self.total is None:
            return GROUP_ROWS
        return max(1, min(GROUP_ROWS, (self.total - self.rows) // (4 * self.workers)))

    def shards(self, shards: list[ShardSource | LoadedShard], specs: dict[str, VerifierSpec],
               outs: list[Path | None]) -> Future:
        """rescore_shards(shards, specs, outs), here or in the pool."""
        return self._run(rescore_shards, (shards, specs, outs), lambda parts: sum(p.rows for p in parts if p.done))

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
