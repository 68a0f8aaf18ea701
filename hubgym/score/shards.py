"""Re-score one stored shard into one output shard: the unit a process pool (or a Ray task) maps over shards.

    choice = VerifierChoice(verifier="my_envs/arith_v2.py")           # in the driver: resolves verifiers
    specs: dict[str, VerifierSpec] = {}
    part = rescore_shard(shard, specs, out_file)                        # anywhere: a worker, a Ray task
    if part.missing:                                                     # envs with no verifier resolved yet
        specs.update({env: choice.spec(env) for env in part.missing})
        part = rescore_shard(shard, specs, out_file)                    # nothing was scored or written before
    part.error                                                           # the shard's ShardError message, or None
    diff = merge_parts([part, ...])                                      # a Diff, as rescore's (diff.py)

    parts = rescore_shards([shard_a, shard_b, ...], specs, [out_a, out_b, ...])   # a bundle, one result each

A worker gets a shard's location (a path, or a ShardSource with the sha256 and rows its run recorded),
not its rows: it maps the file, checks it as every reader of stored shards does (`load_shard`: sha256,
Arrow structure, rollout schema, rows), scores its batches, writes the output shard (every column +
the `rescore_*` columns, one Arrow IPC file, atomically) and returns only counts, the diff's partial
aggregates and the output file's rows and sha256. So nothing but small results crosses processes,
and the hashing, reading and writing spread over the workers too. A bundle of shards is scored as one
(`rescore_shards`), and each output shard holds exactly the bytes it would hold scored alone.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from hubgym.errors import ShardError
from hubgym.files import atomic_write_bytes
from hubgym.hub.shards import LoadedShard, ShardSource, load_shard
from hubgym.score.choice import VerifierSpec
from hubgym.score.diff import COLUMNS, Diff, Tally
from hubgym.score.scoring import RESCORE_SCHEMA, SCORED_COLUMNS, score_batch, slim

GROUP_ROWS = 4096  # rows scored in one call (a call's fixed costs are paid per group, not per batch)
REQUIRED = sorted({*SCORED_COLUMNS, "rollout_id", "run_id", "reward", "metrics"})


@dataclass
class ShardResult:
    """What re-scoring one shard produced; small and picklable (it crosses processes)."""

    shard: str  # the shard's name (its path, or RUN/shards/<file> for a hub shard)
    rows: int = 0
    missing: list[str] = field(default_factory=list)  # envs with no spec given: nothing scored or written
    error: str | None = None  # the shard failed its checks (ShardError's message): nothing scored or written
    broke: tuple[str | None, int | None, str | None] | None = None  # (column, row, rule) of that error, if a row
    diff_rows: pa.Table | None = None  # diff.COLUMNS of its rows (ids, stored and new rewards and metrics)
    run_ids: set[str] = field(default_factory=set)
    output: dict | None = None  # {"name", "rows", "sha256"} of the output shard written
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return not self.missing and self.error is None

    def diff(self) -> Diff:
        """This shard's own Diff (merge_parts gives several shards' together)."""
        return merge_parts([self])


def rescore_shard(shard: ShardSource | LoadedShard | str | Path, specs: Mapping[str, VerifierSpec],
                  out: str | Path | None = None) -> ShardResult:
    """Re-score every row of one local shard file with `specs` (env -> verifier); write `out` if given.

    Returns before scoring anything when the shard holds an env `specs` lacks (`missing`: resolve those in
    the driver, `VerifierChoice.spec`, and call again) or fails its checks (`error`)."""
    return rescore_shards([shard], specs, [out])[0]


def rescore_shards(shards: Sequence[ShardSource | LoadedShard | str | Path], specs: Mapping[str, VerifierSpec],
                   outs: Sequence[str | Path | None] | None = None) -> list[ShardResult]:
    """`rescore_shard` of several shards at once, one result (and one output shard, `outs[i]`) each.

    Their rows are scored together, GROUP_ROWS at a time: a scoring call has fixed costs (building Arrow
    columns, decoding, metrics) that would otherwise be paid per 512-row shard, about 2 ms each. A shard that
    fails its checks gets its `error` and the others are scored; when any shard holds an env `specs` lacks,
    none is scored (each good one lists `missing`)."""
    started = time.perf_counter()
    outs = list(outs) if outs is not None else [None] * len(shards)
    results, opened = [], []  # opened: (result, batches, out) of the shards that passed their checks
    for shard, out in zip(shards, outs, strict=True):
        name, batches = _open(shard)
        if isinstance(batches, ShardError):
            results.append(ShardResult(name, error=str(batches), broke=(batches.column, batches.row, batches.rule)))
        else:
            results.append(ShardResult(name, sum(b.num_rows for b in batches)))
            opened.append((results[-1], batches, out))
    envs = _unique([b.column("env") for _, batches, _ in opened for b in batches])
    missing = [env for env in envs if env not in specs]
    if missing:
        for result, _, _ in opened:
            result.missing = missing
        return results
    tables = iter(_rescored([b for _, batches, _ in opened for b in batches], specs))
    for result, batches, out in opened:
        mine = [next(tables) for _ in batches]
        result.run_ids = set(_unique([t.column("run_id") for t in mine]))
        result.diff_rows = diff_rows(mine)
        if out is not None and mine:
            result.output = write_shard(Path(out), mine)
    for result in results:
        result.seconds = (time.perf_counter() - started) / len(results)
    return results


def _open(shard: ShardSource | LoadedShard | str | Path) -> tuple[str, list[pa.RecordBatch] | ShardError]:
    """(name, batches) of a shard that passes its checks, or (name, its ShardError)."""
    loaded = shard if isinstance(shard, LoadedShard) else None
    source = (loaded.source if loaded else shard if isinstance(shard, ShardSource)
              else ShardSource(str(shard), str(shard)))
    try:
        batches = list((loaded or load_shard(source)).batches())
        for number, batch in enumerate(batches):
            check_columns(batch, f"shard {source.name}, record batch {number}")
    except ShardError as exc:
        return source.name, exc
    return source.name, batches


def _rescored(batches: list[pa.RecordBatch], specs: Mapping[str, VerifierSpec]) -> Iterator[pa.RecordBatch]:
    """Each batch with its new columns (`with_scores`), in order."""
    for group, scores in scored_groups(batches, specs):
        for batch, new in split(group, scores):
            yield with_scores(batch, new)


def _unique(columns: list[pa.Array]) -> list:
    """The distinct values of some string columns, in first-seen order."""
    return pc.unique(pa.chunked_array(columns, pa.string())).to_pylist() if columns else []


def scored_groups(batches: list[pa.RecordBatch],
                  specs: Mapping[str, VerifierSpec]) -> Iterator[tuple[list[pa.RecordBatch], pa.RecordBatch]]:
    """(consecutive batches, their new columns), scored GROUP_ROWS rows at a time."""
    for group in groups(batches, GROUP_ROWS):
        table = pa.Table.from_batches([slim(batch) for batch in group])
        yield group, score_batch({env: specs[env] for env in _unique(table.column("env").chunks)}, table)


def groups(batches: list[pa.RecordBatch], rows: int) -> Iterator[list[pa.RecordBatch]]:
    """Consecutive batches of one slim schema, about `rows` rows together."""
    group: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if group and (count >= rows or not slim(batch).schema.equals(slim(group[0]).schema)):
            yield group
            group, count = [], 0
        group.append(batch)
        count += batch.num_rows
    if group:
        yield group


def split(group: list[pa.RecordBatch], scores: pa.RecordBatch) -> Iterator[tuple[pa.RecordBatch, pa.RecordBatch]]:
    """Each batch of a group with its own rows of the group's new columns, copied out of the group's buffers: a
    slice would carry them along into its output shard, whose bytes would then depend on what it was scored
    with (a bundle, a pool's share)."""
    if len(group) == 1:
        yield group[0], scores
        return
    offset = 0
    for batch in group:
        mine = scores.slice(offset, batch.num_rows)
        yield batch, pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in mine.columns], schema=mine.schema)
        offset += batch.num_rows


def with_scores(batch: pa.RecordBatch, scores: pa.RecordBatch) -> pa.RecordBatch:
    """The stored batch (minus any earlier rescore_* columns) + the new columns."""
    keep = [name for name in batch.schema.names if name not in RESCORE_SCHEMA.names]
    columns = [batch.column(name) for name in keep] + scores.columns
    fields = [batch.schema.field(name) for name in keep] + list(RESCORE_SCHEMA)
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def write_shard(path: Path, batches: list[pa.RecordBatch]) -> dict:
    """One Arrow IPC file of `batches`, written atomically; its name, rows and sha256 (for the manifest)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    data = sink.getvalue()
    atomic_write_bytes(path, data)
    return {"name": path.name, "rows": sum(b.num_rows for b in batches), "sha256": hashlib.sha256(data).hexdigest()}


def check_columns(batch: pa.RecordBatch, where: str) -> None:
    missing = [name for name in REQUIRED if batch.schema.get_field_index(name) < 0]
    if missing:
        raise ShardError(f"{where} lacks the rollout column(s) {', '.join(missing)}; re-score reads shards written "
                         f"by `hubgym rollout` (hubgym's ShardWriter)")


def diff_rows(tables: list[pa.RecordBatch]) -> pa.Table | None:
    """The columns the diff reads (diff.COLUMNS) of re-scored batches: what a worker sends back for the diff."""
    return pa.Table.from_batches([t.select(COLUMNS) for t in tables]) if tables else None


def merge_parts(parts: list[ShardResult]) -> Diff:
    """The Diff of several shards' results (in any order: the diff's tables are sorted)."""
    tally = Tally()
    for part in parts:
        if part.diff_rows is not None:
            tally.add(part.diff_rows)
    return tally.result()
