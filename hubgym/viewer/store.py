"""What `hubgym view` reads: runs (folders or hub refs) as a small index in memory, rows read from one shard at a time.

    store = RunStore.open(["runs/r1", "org/rollouts@abc123:r1"], hub="hf")
    store.runs[0].index          # polars: one line per rollout, small columns only (ids, env, reward, flags, place)
    store.row(0, rollout_id)     # the whole row, read from its shard (the last few shards read are kept)

Each shard is read once when the store opens, checked as every hubgym reader checks it (sha256, Arrow structure,
schema, row count), and only its small columns are kept; messages, token ids and logprobs stay in the shard until a
row is opened. So a run of any size costs memory for its index only (tens of bytes a row), and a hub run is fetched
shard by shard, never whole.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from hubgym.hub.rollout_reader import decode_row, shard_sources, verified_shards
from hubgym.hub.shards import LoadedShard, ShardSource, load_shard
from hubgym.viewer.columns import model_tokens, previews

SMALL_COLUMNS = ["rollout_id", "task_id", "env", "sample", "reward", "finish_reason", "truncated", "num_turns"]
RESCORED_COLUMNS = ["rescore_reward"]
KEEP_SHARDS = 2  # shards kept open for row reads: paging through a run reads each shard once


@dataclass
class Run:
    """One source: its shards and the index of its rows."""

    label: str
    shards: list[ShardSource]
    index: pl.DataFrame  # SMALL_COLUMNS + error (type or null) + tokens, preview (columns.py) + shard, offset
    #                      [+ rescore_reward, rescore_error]

    @property
    def rescored(self) -> bool:
        return "rescore_reward" in self.index.columns


@dataclass
class RunStore:
    """The runs a page shows, and the rows it opens (from a small cache of shards)."""

    runs: list[Run]
    verify: bool = True
    vocab_size: int | None = None  # the token ids a page decodes: rows are held below it (the row contract)
    _open: OrderedDict = field(default_factory=OrderedDict, repr=False)

    @classmethod
    def open(cls, sources: Iterable[str], *, hub: Any = None, verify: bool = True, skip_bad: bool = False,
             progress: Callable[[str, int], None] | None = None, vocab_size: int | None = None) -> "RunStore":
        """Index every source; `progress(label, rows)` hears each shard as it is indexed."""
        runs = [index_run(str(s), hub=hub, verify=verify, skip_bad=skip_bad, progress=progress,
                          vocab_size=vocab_size) for s in sources]
        return cls(runs, verify, vocab_size)

    def row(self, run: int, rollout_id: str) -> dict[str, Any] | None:
        """The whole stored row (info decoded), or None when the run holds no such rollout."""
        found = self.runs[run].index.filter(pl.col("rollout_id") == rollout_id).head(1)
        if found.is_empty():
            return None
        shard, offset = found["shard"][0], found["offset"][0]
        table = self._shard_table(run, shard)
        return decode_row(table.slice(offset, 1).to_pylist()[0], self.runs[run].shards[shard].name)

    def _shard_table(self, run: int, shard: int) -> pa.Table:
        key = (run, shard)
        if key in self._open:
            self._open.move_to_end(key)
            return self._open[key]
        loaded = load_shard(self.runs[run].shards[shard], verify=self.verify, vocab_size=self.vocab_size)
        table = pa.Table.from_batches(list(loaded.batches()))
        self._open[key] = table
        while len(self._open) > KEEP_SHARDS:
            self._open.popitem(last=False)
        return table


def index_run(source: str, *, hub: Any = None, verify: bool = True, skip_bad: bool = False,
              progress: Callable[[str, int], None] | None = None, vocab_size: int | None = None) -> Run:
    """A run's index: the small columns of every shard, read shard by shard (nothing else is kept)."""
    sources = shard_sources(source, hub=hub)
    parts = []
    kept: list[ShardSource] = []
    for loaded in verified_shards(sources, verify=verify, skip_bad=skip_bad, vocab_size=vocab_size):
        parts.append(_small_columns(loaded, len(kept)))
        kept.append(loaded.source)
        if progress is not None:
            progress(source, loaded.rows)
    index = pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()
    return Run(_label(source), kept, index)


def _small_columns(loaded: LoadedShard, shard: int) -> pl.DataFrame:
    tables = []
    for batch in loaded.batches():
        names = batch.schema.names
        columns = {name: batch.column(name) for name in SMALL_COLUMNS}
        columns["error"] = _error_type(batch.column("error"))
        columns["tokens"] = model_tokens(batch.column("completion_mask"))  # a reply's length, to sort by
        columns["preview"] = previews(batch.column("completion"))  # its last reply, one line
        if "rescore_reward" in names:
            columns["rescore_reward"] = batch.column("rescore_reward")
            columns["rescore_error"] = _error_type(batch.column("rescore_error"))
        tables.append(pa.table(columns))
    empty = {**{name: [] for name in SMALL_COLUMNS}, "tokens": pa.array([], pa.int64()),
             "preview": pa.array([], pa.string())}
    table = pa.concat_tables(tables) if tables else pa.table(empty)
    # `take` copies: the selected columns would otherwise be slices of the shard's buffer and keep all of it alive
    table = table.take(pa.array(range(table.num_rows), pa.int64()))
    frame = pl.DataFrame(pl.from_arrow(table))
    return frame.with_columns(pl.lit(shard, pl.Int32).alias("shard"),
                              pl.int_range(0, frame.height, dtype=pl.Int64).alias("offset"))


def _error_type(column: pa.Array) -> pa.Array:
    """A row error's `type` (null when the row has none): what the tables and the error filter show."""
    if pa.types.is_struct(column.type):
        types = column.field("type")
        return pc.if_else(column.is_valid(), types, pa.scalar(None, pa.string()))
    return column.cast(pa.string())


def _label(source: str) -> str:
    path = Path(source)
    return path.name or source if path.exists() else source
