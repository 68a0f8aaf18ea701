"""One rollout shard: where it is, what it should hold, and reading it only once it is known to be whole.

    shard = ShardSource("r1/shards/w000of001-00000.arrow", "hf://datasets/org/r@<rev>/r1/shards/...", sha256, rows)
    for batch in load_shard(shard).batches(): ...      # ShardError if truncated, corrupted or not rollouts

A shard is an Arrow IPC *file*: its footer is written last, so a truncated file does not open. A
flipped byte may still open; the sha256 recorded when the shard was written (the run manifest) or
pushed (the repo's index.json) catches that. But a recorded sha256 is only as good as the file that
records it, which is as untrusted as the shard: so every record batch is also fully validated, and held to
the writer's rules, once, where the bytes are opened (shard_checks.py). A remote shard is read whole into
memory while it is hashed (a shard is at most the writer's max_bytes, 64 MiB by default): nothing is
cached on disk, and no row of a bad shard is ever handed out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from hubgym.errors import HubConnectionError, ShardError, SkippedShardsWarning
from hubgym.hub.shard_checks import FIX, ShardCheck, as_read
from hubgym.schemas.rollouts import ROLLOUT_SCHEMA, column_type_ok
from hubgym.schemas.tasks import parse_json


@dataclass(frozen=True)
class ShardSource:
    """A shard to read, and what it should be."""

    name: str  # how messages name it: RUN/shards/<file> for a hub shard, the path for a local one
    location: str  # a local path, or a URL that fsspec opens (hf://datasets/org/name@<commit>/...)
    sha256: str | None = None  # as recorded by the writer or the push; None: nothing recorded it
    rows: int | None = None
    options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # fsspec options (a token)
    run_ids: frozenset[str] | None = field(default=None, compare=False)  # what its run's manifests record, if any

    @property
    def remote(self) -> bool:
        return "://" in self.location


@dataclass
class LoadedShard:
    """A shard that passed its checks: its batches can be read."""

    source: ShardSource
    reader: pa.ipc.RecordBatchFileReader
    rows: int
    ids: set[str] = field(default_factory=set, repr=False)  # its rollout ids (when checked)

    def batches(self) -> Iterator[pa.RecordBatch]:
        for i in range(self.reader.num_record_batches):
            yield as_read(self.reader.get_batch(i))  # today's column types; a non-finite reward is an error


@dataclass
class FetchedShard:
    """A shard's bytes (a remote one's, or a local one memory-mapped) and their sha256, not yet opened."""

    source: ShardSource
    data: bytes | pa.MemoryMappedFile
    sha256: str


def load_shard(source: ShardSource, *, verify: bool = True, vocab_size: int | None = None) -> LoadedShard:
    """Fetch (remote) or map (local) a shard and check it: sha256 when recorded, Arrow structure, schema, every
    batch fully and the row contract (shard_checks.ShardCheck; token ids below `vocab_size` too, when given), rows.
    `verify=False` checks the structure and schema alone: for files this process wrote itself."""
    return open_fetched(fetch_shard(source), verify=verify, vocab_size=vocab_size)


def fetch_shard(source: ShardSource) -> FetchedShard:
    """The shard's bytes and their sha256: the slow half of load_shard, and nearly all of it outside the GIL
    (reading, hashing), so a thread can do it for the next shards while this one is scored. The hash is of
    the very bytes that are opened afterwards (the mapping), not of the path read again."""
    data = _fetch(source)
    view = data if isinstance(data, bytes) else data.read_buffer(data.size())
    return FetchedShard(source, data, hashlib.sha256(view).hexdigest())


def fetch_or_error(source: ShardSource) -> FetchedShard | ShardError:
    """fetch_shard, its ShardError returned instead of raised (a read-ahead thread hands it to the reader)."""
    try:
        return fetch_shard(source)
    except ShardError as exc:
        return exc


def open_or_error(fetched: FetchedShard | ShardError, *, verify: bool = True,
                  vocab_size: int | None = None) -> LoadedShard | ShardError:
    """open_fetched of what fetch_or_error gave, a ShardError returned instead of raised."""
    if isinstance(fetched, ShardError):
        return fetched
    try:
        return open_fetched(fetched, verify=verify, vocab_size=vocab_size)
    except ShardError as exc:
        return exc


def open_fetched(fetched: FetchedShard, *, verify: bool = True, vocab_size: int | None = None) -> LoadedShard:
    """load_shard's checks on fetched bytes: ShardError unless they are a whole rollout shard whose rows keep the
    row contract."""
    source, data = fetched.source, fetched.data
    if verify and source.sha256 is not None and fetched.sha256 != source.sha256:
        fix = "push its run again from a good copy (`hubgym push-rollouts RUN_DIR REPO`)" if source.remote else FIX
        raise ShardError(f"shard {source.name} is corrupted: its sha256 is {fetched.sha256}, but {source.sha256} was "
                         f"recorded when it was written or pushed; {fix}", shard=source.name, rule="rows-recorded")
    check = ShardCheck(source.name, vocab_size=vocab_size, run_ids=source.run_ids)
    try:
        reader = pa.ipc.open_file(pa.BufferReader(data) if isinstance(data, bytes) else data)
        check_schema(reader.schema, source.name)
        rows = 0
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            if verify:
                check.batch(batch, rows)
            rows += batch.num_rows
        if verify:
            check.finish()
    except (pa.ArrowException, OSError) as exc:  # any Arrow error: a flipped byte can reach any of them
        raise ShardError(f"shard {source.name} is truncated or corrupted ({_first_line(exc)}); {FIX}",
                         shard=source.name) from None
    if verify and source.rows is not None and rows != source.rows:
        raise ShardError(f"shard {source.name} holds {rows} rows, but {source.rows} were recorded; {FIX}",
                         shard=source.name, rule="rows-recorded")
    return LoadedShard(source, reader, rows, check.ids)


def decode_info(text: str, shard: str | None, rollout_id: str | None) -> Any:
    """A row's `info` JSON, decoded; ShardError naming the shard and the row if it is not JSON (a checked shard's
    always is: this names what an unchecked one holds)."""
    try:
        return parse_json(text)
    except (ValueError, RecursionError) as exc:  # json's errors; msgspec's are retried by json
        raise ShardError(f"shard {shard}: row {rollout_id!r} has an `info` that is not JSON ({_first_line(exc)}); "
                         f"{FIX}", shard=shard) from None


def check_schema(schema: pa.Schema, name: str) -> None:
    """Every rollout column, typed as ROLLOUT_SCHEMA types it (extra columns, e.g. re-scoring's, are fine)."""
    bad = [f.name for f in ROLLOUT_SCHEMA
           if schema.get_field_index(f.name) < 0 or not column_type_ok(f.name, schema.field(f.name).type)]
    if bad:
        raise ShardError(f"shard {name} does not have the rollout schema (missing or mistyped: {', '.join(bad[:8])}"
                         f"{', ...' if len(bad) > 8 else ''}); rollout shards are written by hubgym's ShardWriter",
                         shard=name, rule="rollout-schema")
    _check_metadata(schema, name)


def _check_metadata(schema: pa.Schema, name: str) -> None:
    """The schema's and its columns' metadata (datasets' `huggingface` features, Arrow's extension names) are UTF-8
    text, as every writer of Arrow writes them: readers drop the metadata before handing batches out, but a push
    publishes it, so each reader refuses the same shards (rule schema-metadata)."""
    owners = [(None, schema.metadata)] + [(f.name, f.metadata) for f in schema]
    for column, metadata in owners:
        for key, value in (metadata or {}).items():
            try:
                key.decode("utf-8"), value.decode("utf-8")
            except UnicodeDecodeError as exc:
                owner = "the schema" if column is None else f"column {column!r}"
                raise ShardError(f"shard {name}: the metadata of {owner} breaks rule schema-metadata: it is UTF-8 "
                                 f"text (key {key[:40]!r} holds byte {exc.object[exc.start]:#04x}); {FIX}", shard=name,
                                 column=column, rule="schema-metadata") from None


def _fetch(source: ShardSource) -> bytes | pa.MemoryMappedFile:
    """A remote shard's bytes (one streamed GET), or a local one memory-mapped."""
    try:
        if not source.remote:
            return pa.memory_map(source.location) if Path(source.location).stat().st_size else b""
        import fsspec

        with fsspec.open(source.location, "rb", block_size=0, **source.options) as f:  # block_size=0: one stream
            return f.read()
    except FileNotFoundError:
        if source.remote:
            detail = f"in its run's index.json but missing ({source.location}); re-push the run"
        else:
            detail = f"in its run's manifest but missing; {FIX}"
        raise ShardError(f"shard {source.name} is listed {detail}", shard=source.name) from None
    except Exception as exc:
        if not source.remote and isinstance(exc, OSError):  # e.g. a folder where the shard should be
            raise ShardError(f"shard {source.name} cannot be read ({_first_line(exc)}); {FIX}",
                             shard=source.name) from None
        if not source.remote:
            raise
        # the network, or the hub refusing: not the shard's fault (the message never shows the options)
        raise HubConnectionError(f"cannot read shard {source.name} from {source.location.split('@')[0]}: "
                                 f"{_first_line(exc)}. Check the network and the token, then read again") from None


def shard_rows(source: ShardSource) -> int | None:
    """The rows a shard holds as far as is known without reading it: recorded, or a local file's footer."""
    return source.rows if source.rows is not None or source.remote else footer_rows(source.location)


def skipped_warning(bad: list[tuple[str, int | None, ShardError | str]], read: int) -> SkippedShardsWarning:
    """The note of a `skip_bad` read: how many shards (of how many) and rows it left out, each shard with what broke
    (column, row and rule where one row did), so a read that goes on is never silent about what it dropped."""
    known = [rows for _, rows, _ in bad if rows is not None]
    rows = f"{sum(known)} row(s)" + ("" if len(known) == len(bad) else " and shards whose rows are not recorded")
    shown = [f"{name} ({_why(error)})" for name, _, error in bad]
    return SkippedShardsWarning(f"skipped {len(bad)} bad shard(s) (of {read} in this read), holding {rows}: "
                                f"{'; '.join(shown)}")


def _why(error: ShardError | str) -> str:
    if isinstance(error, ShardError) and error.row is not None:  # one row broke a rule: where, and which
        return f"column {error.column!r}, row {error.row}: rule {error.rule}"
    text = str(error).split("; ", 1)[0]
    return text[:160] + ("..." if len(text) > 160 else "")


def footer_rows(path: str) -> int | None:
    """The rows a local shard's footer declares (cheap: no data is read), or None if it does not open."""
    try:
        with pa.memory_map(path) as f:
            return pa.ipc.open_file(f).count_rows()
    except (pa.ArrowException, OSError):
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
