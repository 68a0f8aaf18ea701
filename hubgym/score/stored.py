"""Stored rollouts as a stream of Arrow record batches, whatever holds them.

    stored = open_source("runs/r1")                        # a run folder (every shard under it)
    stored = open_source(["a.arrow", "org/rollouts@3f1c2e9:r1"], hub="hf")   # shard files and hub runs
    stored = open_source(batch_iterator)                   # any Iterable[pa.RecordBatch]
    for batch in stored.batches: ...

Local shards are memory-mapped and read in place; a hub ref `org/name[@revision][:RUN]` streams.
Both go through hubgym.hub's rollout reader, which checks each shard (recorded sha256, Arrow
structure, rollout schema, rows) before any of its rows is used. Batches are cut to at most
`max_rows` rows, so the work spreads evenly over processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from hubgym.errors import NoShardsError
from hubgym.hub.shards import ShardSource, footer_rows

Source = str | os.PathLike | pa.RecordBatch | pa.Table | Iterable
BATCH_ROWS = 512  # the rollout writer's default shard size


@dataclass
class StoredRollouts:
    batches: Iterator[pa.RecordBatch]
    rows: int | None  # known before reading for local shards (progress bars), else None
    names: list[str] = field(default_factory=list)  # the sources, as the manifest records them
    local: list[Path] = field(default_factory=list)  # local files and folders read (output must not go there)
    shards: list[ShardSource] | None = None  # every shard, when all are local files (workers can read them)


def open_source(source: Source, *, hub=None, max_rows: int = BATCH_ROWS, skip_bad: bool = False) -> StoredRollouts:
    """Record batches of `source`: paths, hub refs, a list of these, or record batches themselves.

    Shards are read as iter_rollouts reads them (hubgym.hub.rollout_reader.verified_shards): each is
    checked against the sha256 its run manifest or index.json records, its Arrow structure and the rollout
    schema before any of its rows is used; a bad one is ShardError naming it, or with `skip_bad` is left out."""
    if isinstance(source, (pa.RecordBatch, pa.Table)):
        return StoredRollouts(_cut(source.to_batches() if isinstance(source, pa.Table) else [source], max_rows),
                              source.num_rows, ["<record batches>"])
    items = [source] if isinstance(source, (str, os.PathLike)) else source
    if isinstance(items, (list, tuple)) and items and all(isinstance(s, (str, os.PathLike)) for s in items):
        return _open_paths([str(s) for s in items], hub, max_rows, skip_bad)
    if isinstance(items, (list, tuple)) and not items:
        raise NoShardsError("no source given; give a run folder, shard files or a hub ref org/name[@revision][:RUN]")
    return StoredRollouts(_cut(iter(items), max_rows), None, ["<record batches>"])


def _open_paths(sources: list[str], hub, max_rows: int, skip_bad: bool) -> StoredRollouts:
    from hubgym.hub.rollout_reader import shard_sources, verified_shards

    for source in sources:
        if not Path(source).exists() and not is_hub_ref(source):
            raise NoShardsError(f"{source} does not exist; give a run folder, shard files, or a hub ref "
                                f"org/name[@revision][:RUN]")
    shards = shard_sources(sources, hub=hub)  # a hub run's index.json is read here, its shards when reached
    batches = (b for loaded in verified_shards(shards, skip_bad=skip_bad) for b in loaded.batches())
    local = [Path(s) for s in sources if Path(s).exists()]
    every_local = None if any(shard.remote for shard in shards) else shards
    return StoredRollouts(_cut(batches, max_rows), _rows(shards), sources, local, every_local)


def is_hub_ref(source: str) -> bool:
    """`org/name[@revision][:RUN]`: one slash, not a relative or absolute path, not a file name."""
    head = source.partition(":")[0].partition("@")[0]
    return head.count("/") == 1 and not source.startswith((".", "/", "~")) and not source.endswith(".arrow")


def _rows(shards: list[ShardSource]) -> int | None:
    """The rows to read, as recorded (or, for a local shard nothing recorded, as its footer says); None if a
    footer does not open (reading it then raises the shard's error)."""
    total = 0
    for shard in shards:
        rows = shard.rows if shard.rows is not None or shard.remote else footer_rows(shard.location)
        if rows is None:
            return None
        total += rows
    return total


def _cut(batches: Iterable[pa.RecordBatch], max_rows: int) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(f"expected pyarrow RecordBatches, got {type(batch).__name__}")
        for start in range(0, batch.num_rows, max_rows):
            yield batch.slice(start, max_rows)
