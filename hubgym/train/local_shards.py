"""A row source over local rollout shards: pyarrow, one record batch at a time, only the columns training reads.

    rows = LocalShards(["runs/r1", "runs/r2/shards/w000of001-00003.arrow"])   # folders and/or shard files
    stream = GroupStream([rows], GroupSettings(n=8))

Any iterable of row dicts is a source for GroupStream (the Hub reader in hubgym.hub.rollouts is
another); this one reads local run folders directly. It decodes only `TRAIN_COLUMNS` (not the
prompt and completion messages), and `skip(n)` passes over whole record batches without
decoding them, which is how GroupStream.restore() fast-forwards to a checkpointed position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa

from hubgym.hub.rollout_reader import local_shard_sources
from hubgym.hub.shard_checks import SeenRollouts, as_read
from hubgym.hub.shards import load_shard
from hubgym.schemas.tasks import parse_json

# What grouping, packing and the per-env training metrics read; the messages stay on disk.
TRAIN_COLUMNS = ("rollout_id", "run_id", "task_id", "env", "group", "sample", "prompt_ids", "completion_ids",
                 "completion_mask", "completion_logprobs", "tokens_consistent", "reward", "metrics", "finish_reason",
                 "truncated", "num_turns", "error", "provenance")


class LocalShards:
    """An iterator of rollout row dicts over local shards; `columns=None` reads every column."""

    def __init__(self, paths: Sequence[str | Path] | str | Path, columns: Sequence[str] | None = TRAIN_COLUMNS,
                 vocab_size: int | None = None):
        # Each shard is read as every reader of stored shards reads it (load_shard: recorded sha256, structure,
        # schema, rows, the row contract: token ids below `vocab_size` too, when given), and one its run's manifest
        # lists but the folder lacks is named, not quietly left out.
        self.vocab_size = vocab_size
        self._sources = local_shard_sources([paths] if isinstance(paths, (str, Path)) else list(paths))
        self.files = [Path(s.location) for s in self._sources]
        self.columns = list(columns) if columns is not None else None
        self._file = -1  # index of the open file
        self._reader: pa.ipc.RecordBatchFileReader | None = None
        self._seen = SeenRollouts()  # a rollout id a second shard repeats is refused, as every reader refuses it
        self._batch = 0  # next record batch of the open file
        self._rows: list[dict[str, Any]] = []  # decoded rows of the current batch, consumed from the front
        self._row = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        while self._row >= len(self._rows):
            batch = self._next_batch()
            if batch is None:
                raise StopIteration
            if self.columns is not None:
                batch = batch.select([c for c in self.columns if c in batch.schema.names])
            self._rows, self._row = batch.to_pylist(), 0
        row = self._rows[self._row]
        self._row += 1
        if isinstance(row.get("info"), str):  # the JSON column comes back as the dict it was
            row["info"] = parse_json(row["info"])
        return row

    def skip(self, n: int) -> int:
        """Pass over up to n rows, undecoded where a whole record batch is skipped; the rows skipped."""
        done = min(n, len(self._rows) - self._row)
        self._row += done
        while done < n:
            batch = self._next_batch()
            if batch is None:
                break
            if done + batch.num_rows <= n:  # the whole batch: never decoded
                done += batch.num_rows
                continue
            rest = batch.select([c for c in self.columns if c in batch.schema.names]) if self.columns else batch
            self._rows, self._row = rest.to_pylist(), n - done
            done = n
        return done

    def _next_batch(self) -> pa.RecordBatch | None:
        while self._reader is None or self._batch >= self._reader.num_record_batches:
            self._file += 1
            if self._file >= len(self.files):
                self._reader = None
                return None
            loaded = load_shard(self._sources[self._file], vocab_size=self.vocab_size)
            self._seen.add(loaded.source.name, loaded.ids)
            self._reader, self._batch = loaded.reader, 0
        batch = as_read(self._reader.get_batch(self._batch))  # today's column types; a non-finite reward: an error
        self._batch += 1
        return batch
