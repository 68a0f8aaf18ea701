"""Stream rollout rows into Arrow IPC shards: atomic, rotated, resumable.

Layout of a run folder (one worker shown; N workers write disjoint files side by side):

    RUN/
      manifest-w000of001.json          run manifest of worker 0 (rewritten atomically after each shard;
                                       lists each shard's rows and sha256, so readers can verify it)
      shards/w000of001-00000.arrow     Arrow IPC *file* format: pyarrow, polars and datasets all read it

A shard is written to a hidden temporary file, fsynced, then renamed: a crash never leaves a
half-written shard visible. Rows are added a whole GRPO group at a time, so a shard never
holds part of a group; on resume, `existing_ids()` says which rollouts are already stored.

Finished groups reach disk within `flush_every_s` seconds, not only when a shard fills: the shard being
filled (the *open* shard) is then written with the rows it has so far, and written again, under the same
name, each time more rows are due, until it is full and the next one opens. So a kill loses at most a few
seconds of sampling, and a run that is not killed ends with the same shards as one flushed by size alone.

Every shard is held to the row contract (hubgym.schemas.row_contract) before it is written: a row that readers
would refuse (a negative token id, a NaN logprob, two tasks in one group) is a RowContractError naming it, and
nothing is written.

A writer holds its part of the run folder for its lifetime (`RunLock`: an OS lock, dropped when the
process ends in any way) and, given a `run_id`, refuses a folder that holds another run (`claim_run`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa

from hubgym.errors import RowContractError, ShardError
from hubgym.files import atomic_write_bytes, sha256_file
from hubgym.rollout.runlock import RunLock, claim_run
from hubgym.hub.shard_checks import FIX, ShardCheck
from hubgym.schemas.rollouts import ROLLOUT_FEATURES, ROLLOUT_SCHEMA, Rollout

FLUSH_EVERY_S = 5.0  # a finished group waits at most this long before it is on disk


def worker_name(shard_index: int, num_shards: int) -> str:
    return f"w{shard_index:03d}of{num_shards:03d}"


@dataclass(frozen=True)
class PendingShard:
    """Rows taken for one write of shard `path`: the open shard's rows so far plus the new ones, sorted."""

    path: Path
    rows: list[Rollout]
    final: bool  # the shard is full: the next write opens the next shard


class ShardWriter:
    def __init__(self, run_dir: str | Path, worker: str, *, max_rows: int = 512, max_bytes: int = 64 << 20,
                 flush_every_s: float = FLUSH_EVERY_S, run_id: str | None = None, lock: bool = True):
        self.run_dir, self.worker = Path(run_dir), worker
        if run_id is not None:  # before the lock: a folder of another run is refused whoever writes it now
            claim_run(self.run_dir, run_id)
        self._lock = RunLock(self.run_dir, worker) if lock else None  # the caller may hold it already
        try:
            self._open_folder(max_rows, max_bytes, flush_every_s)
        except BaseException:
            self.close()
            raise

    def _open_folder(self, max_rows: int, max_bytes: int, flush_every_s: float) -> None:
        worker = self.worker
        self.shard_dir = self.run_dir / "shards"
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        self.max_rows, self.max_bytes, self.flush_every_s = max_rows, max_bytes, flush_every_s
        self._buffer: list[Rollout] = []  # rows not on disk yet
        self._open: list[Rollout] = []  # rows already in the open shard's file
        self._bytes = 0  # estimated bytes of _open + _buffer
        self._buffered_since = 0.0  # time.monotonic() when the oldest buffered row arrived
        stale_temps = [*self.shard_dir.glob(f".{worker}-*.tmp"), *self.run_dir.glob(f".manifest-{worker}.json*.tmp")]
        for stale in stale_temps:  # left by a crash mid-write (only this worker's: others may be writing)
            stale.unlink()
        shards = self.shards()
        self._next = 1 + max((int(p.stem.rsplit("-", 1)[1]) for p in shards), default=-1)  # the open shard
        recorded = self._recorded_files()  # a resumed worker reads only shards its manifest does not list yet;
        if shards:  # the last one may have been written again after the manifest was: always read it
            recorded.pop(shards[-1].name, None)
        self._files = {p.name: recorded.get(p.name) or {"rows": _count_rows(p), "sha256": sha256_file(p)}
                       for p in shards}

    def close(self) -> None:
        """Give the run folder part back to other processes (the process ending does the same)."""
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def rows_written(self) -> int:
        return sum(f["rows"] for f in self._files.values())

    def _recorded_files(self) -> dict[str, dict[str, Any]]:
        manifest = self.run_dir / f"manifest-{self.worker}.json"
        if not manifest.exists():
            return {}
        return json.loads(manifest.read_text()).get("shard_files") or {}

    def shards(self) -> list[Path]:
        return sorted(self.shard_dir.glob(f"{self.worker}-*.arrow"))

    def manifest_is_current(self) -> bool:
        """The manifest on disk lists exactly this worker's shards, with their rows and sha256 as they are now."""
        return self._recorded_files() == self.shard_files()

    def shard_files(self) -> dict[str, dict[str, Any]]:
        """{shard file name: {"rows", "sha256"}} of this worker's shards, for the manifest (readers verify with it)."""
        return {name: dict(info) for name, info in sorted(self._files.items())}

    def existing_ids(self) -> set[str]:
        """rollout_ids already stored by this worker (read from the id column only)."""
        ids: set[str] = set()
        for path in self.shards():
            with pa.memory_map(str(path)) as source:
                ids.update(pa.ipc.open_file(source).read_all().column("rollout_id").to_pylist())
        return ids

    def add_group(self, rows: Iterable[Rollout], flush: bool = True) -> list[Path]:
        """Buffer one group's rows; returns the shards written by this call (if the shard filled).
        With `flush=False` it only buffers: the caller checks `full` or `due`, then `take`s the rows and writes
        them with `write_shard` itself (e.g. in a thread)."""
        rows = list(rows)
        if rows and not self._buffer:
            self._buffered_since = time.monotonic()
        self._buffer += rows
        self._bytes += sum(_estimate_bytes(r) for r in rows)
        return [self.flush()] if flush and self.full else []

    @property
    def full(self) -> bool:
        return len(self._open) + len(self._buffer) >= self.max_rows or self._bytes >= self.max_bytes

    @property
    def due(self) -> bool:
        """Rows should be written now: the shard is full, or the oldest buffered row waited `flush_every_s`."""
        waited = time.monotonic() - self._buffered_since
        return bool(self._buffer) and (self.full or waited >= self.flush_every_s)

    def take(self) -> PendingShard | None:
        """The next write (None when nothing is buffered): the open shard's rows plus the buffered groups that fit,
        sorted by group and sample. Write takes with `write_shard` in the order they were taken.

        A shard takes whole groups until it holds `max_rows` (or `max_bytes`); groups buffered past that wait for
        the next shard, so a shard never grows past its bound however many groups finished during a write.
        Groups reach the buffer in the order they finish, which depends on timing; a trainer streams
        them in stored order, so a shard stores them sorted and the same rows make the same shard."""
        if not self._buffer:
            return None
        fits = self._groups_that_fit()
        taken, self._buffer = self._buffer[:fits], self._buffer[fits:]
        rows = sorted(self._open + taken, key=lambda row: (row["group"], row["sample"]))
        final = len(rows) >= self.max_rows or sum(map(_estimate_bytes, rows)) >= self.max_bytes
        shard = PendingShard(self.shard_dir / f"{self.worker}-{self._next:05d}.arrow", rows, final)
        if final:
            self._open, self._next = [], self._next + 1
            self._bytes = sum(map(_estimate_bytes, self._buffer))
        else:
            self._open = rows
        return shard

    def _groups_that_fit(self) -> int:
        """How many buffered rows the next write takes: whole groups, in arrival order, until the shard is full."""
        count, size = len(self._open), sum(map(_estimate_bytes, self._open))
        for i, row in enumerate(self._buffer):
            if (count >= self.max_rows or size >= self.max_bytes) and row["group"] != self._buffer[i - 1]["group"]:
                return i
            count, size = count + 1, size + _estimate_bytes(row)
        return len(self._buffer)

    def flush(self) -> Path | None:
        """Write everything buffered now (full shards, then the open one); the last shard written."""
        path = None
        while (shard := self.take()) is not None:
            path = self.write_shard(shard)
        return path

    def flush_due(self) -> Path | None:
        """Write what is buffered if it is `due`."""
        return self.flush() if self.due else None

    def write_shard(self, shard: PendingShard | None) -> Path | None:
        """Write a taken shard (one call at a time, in the order taken); it replaces an earlier write of it."""
        if shard is None:
            return None
        table = _to_table(shard.rows)
        check_rows(table, shard.path.name)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, ROLLOUT_SCHEMA) as writer:
            writer.write_table(table)
        data = sink.getvalue().to_pybytes()
        atomic_write_bytes(shard.path, data)
        self._files[shard.path.name] = {"rows": len(shard.rows), "sha256": hashlib.sha256(data).hexdigest()}
        return shard.path

    def write_manifest(self, manifest: dict[str, Any]) -> Path:
        path = self.run_dir / f"manifest-{self.worker}.json"
        atomic_write_bytes(path, json.dumps(manifest, indent=2, sort_keys=True, default=str).encode())
        return path


def check_rows(table: pa.Table, shard: str) -> None:
    """RowContractError naming the first row of `table` (about to be written as `shard`) that a reader would refuse
    (shard_checks.ShardCheck: no null where none is written, `info` JSON, dates, unique ids, the row contract),
    or nothing: the writer stores only what every reader takes."""
    check, first = ShardCheck(shard), 0
    try:
        for batch in table.to_batches():
            check.batch(batch, first)
            first += batch.num_rows
        check.finish()
    except ShardError as exc:
        what = str(exc).removesuffix(f"; {FIX}")
        raise RowContractError(f"{what}; every reader refuses such a row, so it is not written: fix the code that "
                               f"made it", column=exc.column, row=exc.row, rule=exc.rule) from None


def rows_table(rows: list[Rollout]) -> pa.Table:
    """Rollout rows as the table a shard holds (what `write_shard` writes, before its checks)."""
    return _to_table(rows)


def _to_table(rows: list[Rollout]) -> pa.Table:
    """The same table as `schemas.tables.rollouts_to_table`, built column by column: ~10x faster.

    `Features.encode_example` walks every nested value of every row in Python (~0.5 ms a row, which
    made writing cost ~20% of a short-reply run); Arrow converts plain lists, dicts and datetimes
    itself. Only extension columns (`info`, a JSON column) need datasets' encoding.
    """
    columns = []
    for f in ROLLOUT_SCHEMA:
        values = [row.get(f.name) for row in rows]
        if isinstance(f.type, pa.BaseExtensionType):
            encode = ROLLOUT_FEATURES[f.name].encode_example
            storage = pa.array([encode(v) for v in values], f.type.storage_type)
            columns.append(pa.ExtensionArray.from_storage(f.type, storage))
        else:
            columns.append(pa.array(values, f.type))
    return pa.Table.from_arrays(columns, schema=ROLLOUT_SCHEMA)


def _count_rows(path: Path) -> int:
    with pa.memory_map(str(path)) as source:
        reader = pa.ipc.open_file(source)
        return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))



def _estimate_bytes(row: Rollout) -> int:
    """Token lists dominate a row: 4 bytes per prompt id; 9 per completion token (id, logprob, mask)."""
    return 4 * len(row["prompt_ids"]) + 9 * len(row["completion_ids"]) + 512
