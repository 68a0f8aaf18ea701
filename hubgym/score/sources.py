"""Stored rollouts as a stream of Arrow record batches, whatever holds them.

    stored = open_source("runs/r1")                        # a run folder (every shard under it)
    stored = open_source(["a.arrow", "org/rollouts@3f1c2e9:r1"], hub="hf")   # shard files and hub runs
    stored = open_source(batch_iterator)                   # any Iterable[pa.RecordBatch]
    for batch in stored.batches: ...

Local shards are memory-mapped and read in place. A hub ref `org/name[@revision][:RUN]` streams
through hubgym.hub's rollout reader (each shard checked against its recorded sha256). Batches are
cut to at most `max_rows` rows, so the work spreads evenly over processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from hubgym.errors import NoShardsError, ShardError
from hubgym.rollout.report import shard_files

Source = str | os.PathLike | pa.RecordBatch | pa.Table | Iterable
BATCH_ROWS = 512  # the rollout writer's default shard size


@dataclass
class StoredRollouts:
    batches: Iterator[pa.RecordBatch]
    rows: int | None  # known before reading for local shards (progress bars), else None
    names: list[str] = field(default_factory=list)  # the sources, as the manifest records them
    local: list[Path] = field(default_factory=list)  # local files and folders read (output must not go there)


def open_source(source: Source, *, hub=None, max_rows: int = BATCH_ROWS) -> StoredRollouts:
    """Record batches of `source`: paths, hub refs, a list of these, or record batches themselves."""
    if isinstance(source, (pa.RecordBatch, pa.Table)):
        return StoredRollouts(_cut(source.to_batches() if isinstance(source, pa.Table) else [source], max_rows),
                              source.num_rows, ["<record batches>"])
    items = [source] if isinstance(source, (str, os.PathLike)) else source
    if isinstance(items, (list, tuple)) and items and all(isinstance(s, (str, os.PathLike)) for s in items):
        return _open_paths([str(s) for s in items], hub, max_rows)
    if isinstance(items, (list, tuple)) and not items:
        raise NoShardsError("no source given; give a run folder, shard files or a hub ref org/name[@revision][:RUN]")
    return StoredRollouts(_cut(iter(items), max_rows), None, ["<record batches>"])


def _open_paths(sources: list[str], hub, max_rows: int) -> StoredRollouts:
    local = [Path(s) for s in sources if Path(s).exists()]
    for source in sources:
        if not Path(source).exists() and not is_hub_ref(source):
            raise NoShardsError(f"{source} does not exist; give a run folder, shard files, or a hub ref "
                                f"org/name[@revision][:RUN]")
    files = {s: shard_files([s]) for s in sources if Path(s).exists()}
    rows = None if len(files) < len(sources) else sum(_file_rows(f) for found in files.values() for f in found)
    parts = (_read_files(files[s]) if s in files else _hub_batches(s, hub) for s in sources)
    return StoredRollouts(_cut((b for part in parts for b in part), max_rows), rows, sources, local)


def is_hub_ref(source: str) -> bool:
    """`org/name[@revision][:RUN]`: one slash, not a relative or absolute path, not a file name."""
    head = source.partition(":")[0].partition("@")[0]
    return head.count("/") == 1 and not source.startswith((".", "/", "~")) and not source.endswith(".arrow")


def _read_files(files: list[Path]) -> Iterator[pa.RecordBatch]:
    for path in files:
        reader = _open(path)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


def _open(path: Path) -> pa.ipc.RecordBatchFileReader:
    """A memory-mapped shard (its batches stay valid after the next file is opened)."""
    try:
        return pa.ipc.open_file(pa.memory_map(str(path)))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ShardError(f"shard {path} is truncated or not an Arrow IPC file ({exc}); delete it and re-run the "
                         f"rollout that wrote it (it resumes and rewrites only what is missing)",
                         shard=str(path)) from None


def _file_rows(path: Path) -> int:
    reader = _open(path)
    return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))


def _hub_batches(ref: str, hub) -> Iterator[pa.RecordBatch]:
    from hubgym.hub.rollouts import iter_batches

    return iter_batches(ref, hub=hub)


def _cut(batches: Iterable[pa.RecordBatch], max_rows: int) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(f"expected pyarrow RecordBatches, got {type(batch).__name__}")
        for start in range(0, batch.num_rows, max_rows):
            yield batch.slice(start, max_rows)
