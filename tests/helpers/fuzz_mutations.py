"""What the stored-data fuzzer (fuzz_stored.py) does to a file, and how it tells valid data from invalid.

Byte mutations work on any file: bit flips, insertions, overwrites, repeated ranges, truncations. Crafted
mutations rewrite a shard as someone out to break a reader would: rows repeated, non-finite or extreme
numbers, `info` that is not JSON or is nested 100,000 deep, nulls where the writer never writes one, and
Arrow arrays whose buffers lie (offsets out of order or out of range, invalid UTF-8) in valid IPC framing.
Value mutations (fuzz_values.py) keep the Arrow valid and change what cells hold: out of range, not finite,
negative, one value short or long, copied from another row (groups of two tasks), a reward on a failed row.
Either way the caller then records the mutated shard's
sha256 (and, for crafted ones, its rows) where the run manifest or index.json keeps them, so the integrity
check passes and only the readers' own validation stands between the bytes and the code.

The oracle (`shard_problem`, `json_problem`, `run_manifest_problem`) is independent of hubgym's readers:
pyarrow's full validation, the original schema, JSON that Python reads, unique rollout ids, the recorded rows,
the fields the writer never leaves null, the row contract's rules written out in plain Python
(fuzz_values.values_problem: token ids, logprobs, masks, counts, kinds, one task per group, the manifest's run
id), and a run manifest's fields of the types its writers write. A command that exits 0 on data the oracle calls
invalid is a silent success.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

from helpers.fuzz_values import mutate_values, values_problem

INTERESTING_BYTES = [b"\x00", b"\xff", b"\x7f", b"\x80", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff",
                     b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", b"\x01\x00\x00\x00", b"\xc3\x28", b"\xed\xa0\x80"]
REQUIRED = ("rollout_id", "run_id", "task_id", "env", "group", "sample", "prompt", "completion", "info",
            "interaction", "prompt_ids", "completion_ids", "completion_mask", "completion_logprobs",
            "finish_reason", "truncated", "num_turns", "provenance", "timings", "created_at")
"""Columns the rollout writer never leaves null (a shard holding a null there was not written by it)."""


@dataclass(frozen=True)
class Mutation:
    name: str  # e.g. "flip 3 bits at 1234": enough to tell mutants apart in a report
    data: bytes
    crafted: bool = False  # a rewritten table: its recorded rows are recomputed along with its sha256


# -- bytes --------------------------------------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: random.Random) -> Mutation:
    """One random byte-level mutation of `data`."""
    kind = rng.choice(["flip", "flip", "flip", "insert", "overwrite", "overwrite", "repeat", "truncate"])
    at = rng.randrange(max(len(data), 1))
    if kind == "flip":
        out, bits = bytearray(data), rng.randint(1, 8)
        for _ in range(bits):
            where = rng.randrange(len(out)) if rng.random() < 0.5 else min(at + rng.randrange(16), len(out) - 1)
            out[where] ^= 1 << rng.randrange(8)
        return Mutation(f"flip {bits} bit(s) near {at}", bytes(out))
    if kind == "insert":
        chunk = _chunk(data, rng)
        return Mutation(f"insert {len(chunk)} byte(s) at {at}", data[:at] + chunk + data[at:])
    if kind == "overwrite":
        chunk = _chunk(data, rng)
        return Mutation(f"overwrite {len(chunk)} byte(s) at {at}", data[:at] + chunk + data[at + len(chunk):])
    if kind == "repeat":
        size = rng.randint(1, 256)
        return Mutation(f"repeat {size} byte(s) at {at}", data[:at + size] + data[at:at + size] + data[at + size:])
    return Mutation(f"truncate at {at}", data[:at])


def _chunk(data: bytes, rng: random.Random) -> bytes:
    """Bytes to insert or write: interesting values, random bytes, or a piece of the file itself."""
    roll = rng.random()
    if roll < 0.4:
        return rng.choice(INTERESTING_BYTES)
    if roll < 0.7:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    start = rng.randrange(max(len(data), 1))
    return data[start:start + rng.randint(1, 64)]


def mutate_json(data: bytes, rng: random.Random) -> Mutation:
    """A byte mutation, or a value replaced by a hostile one (a huge or non-finite number, a deep array)."""
    if rng.random() < 0.7:
        return mutate_bytes(data, rng)
    text = data.decode("utf-8", "replace")
    spots = [i for i, ch in enumerate(text) if ch in ":,["]
    if not spots:
        return mutate_bytes(data, rng)
    at = rng.choice(spots) + 1
    end = at
    while end < len(text) and text[end] not in ",}]":
        end += 1
    value = rng.choice(["1e308", "-1e999", "NaN", "Infinity", "-1", "9" * 400, "null", "true", "[]", "{}",
                        '"' + "x" * 5000 + '"', "[" * 100_000 + "]" * 100_000, '"\\ud800"', "0.5"])
    return Mutation(f"value at {at} -> {value[:12]}", (text[:at] + value + text[end:]).encode())


# -- crafted shards -----------------------------------------------------------------------------------------


def read_table(data: bytes) -> pa.Table:
    return pa.ipc.open_file(pa.BufferReader(data)).read_all()


def write_table(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _set(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), table.schema.field(name), array)


def _set_value(table: pa.Table, name: str, row: int, value: Any) -> pa.Table:
    values = table.column(name).to_pylist()
    values[row] = value
    return _set(table, name, pa.array(values, table.schema.field(name).type))


def _set_info(table: pa.Table, row: int, text: str) -> pa.Table:
    info = table.column("info").combine_chunks()
    storage = info.storage.to_pylist()
    storage[row] = text
    return _set(table, "info", pa.ExtensionArray.from_storage(info.type, pa.array(storage, pa.string())))


def _metric_value(table: pa.Table, row: int, value: float) -> pa.Table:
    metrics = table.column("metrics").to_pylist()
    if metrics[row]:
        metrics[row][0]["value"] = value
    return _set(table, "metrics", pa.array(metrics, table.schema.field("metrics").type))


def _mutable_strings(array: pa.Array) -> tuple[pa.Array, bytearray, bytearray]:
    """A copy of a string array over buffers that stay writable: changed after the array passed its checks, they
    make an array that breaks Arrow's rules, which the IPC writer writes as it finds it."""
    validity, offsets, data = array.buffers()
    ints = memoryview(offsets).cast("i")[array.offset:array.offset + len(array) + 1]
    base = ints[0]
    starts = bytearray(pa.array([i - base for i in ints], pa.int32()).buffers()[1].to_pybytes())
    raw = bytearray(data.to_pybytes()[base:ints[-1]] if data is not None else b"") or bytearray(b" ")
    bits = pa.py_buffer(validity.to_pybytes()) if validity is not None and array.offset == 0 else None
    copy = pa.Array.from_buffers(pa.string(), len(array), [bits, pa.py_buffer(starts), pa.py_buffer(raw)],
                                 null_count=-1 if bits is not None else 0)
    return copy, starts, raw


def _break_strings(starts: bytearray, raw: bytearray, rng: random.Random, how: str) -> None:
    """Only offsets between the first and the last change: the IPC writer itself copies the range they span."""
    ints = memoryview(starts).cast("i")
    inner = rng.randrange(1, len(ints) - 1) if len(ints) > 2 else None
    if how == "offsets out of order" and inner is not None:
        ints[inner] = ints[len(ints) - 1] + 7
    elif how == "offsets past the end" and inner is not None:
        ints[inner] += 1 << 20
    elif how == "negative offset" and inner is not None:
        ints[inner] = -(1 << 20)
    else:  # invalid UTF-8
        raw[rng.randrange(len(raw))] = 0xFF


def _mutable_list(array: pa.Array) -> tuple[pa.Array, bytearray]:
    """A copy of a list array over an offsets buffer that stays writable."""
    offsets = bytearray(array.offsets.buffers()[1].to_pybytes())
    copy = pa.Array.from_buffers(array.type, len(array), [None, pa.py_buffer(offsets)], null_count=0,
                                 children=[array.values])
    return copy, offsets


STRING_COLUMNS = ("rollout_id", "env", "group", "task_id", "finish_reason")
LIST_COLUMNS = ("prompt_ids", "completion_ids", "completion_mask", "completion_logprobs", "prompt", "completion")
LYING_STRINGS = ("offsets out of order", "offsets past the end", "negative offset", "invalid utf-8")


def _lie(table: pa.Table, rng: random.Random) -> tuple[str, pa.Table]:
    """A column whose buffers break Arrow's rules (offsets, UTF-8), in framing the IPC reader accepts."""
    roll = rng.random()
    if roll < 0.45:
        name, how = rng.choice(STRING_COLUMNS), rng.choice(LYING_STRINGS)
        array, starts, raw = _mutable_strings(table.column(name).combine_chunks())
        table = _set(table, name, array)
        _break_strings(starts, raw, rng, how)
        return f"{name}: {how}", table
    if roll < 0.7:
        name = rng.choice(LIST_COLUMNS)
        array, offsets = _mutable_list(table.column(name).combine_chunks())
        table = _set(table, name, array)
        ints = memoryview(offsets).cast("i")
        if len(ints) > 2:  # between the first and the last, as for strings
            at = rng.randrange(1, len(ints) - 1)
            ints[at] = rng.choice([ints[len(ints) - 1] + 1, -1, (ints[at] + 1) << 20])
        return f"{name}: list offsets out of range", table
    name = rng.choice(["completion", "prompt"])
    messages = table.column(name).combine_chunks()
    structs = messages.values
    how = rng.choice(LYING_STRINGS)
    fields = [structs.field(i) for i in range(structs.type.num_fields)]
    at = structs.type.get_field_index("content")
    fields[at], starts, raw = _mutable_strings(fields[at])
    lists = pa.ListArray.from_arrays(messages.offsets, pa.StructArray.from_arrays(fields, fields=list(structs.type)),
                                     type=messages.type)
    table = _set(table, name, lists)
    _break_strings(starts, raw, rng, how)
    return f"{name}.content: {how}", table


CRAFTED: dict[str, Callable[[pa.Table, random.Random], pa.Table]] = {
    "rows repeated": lambda t, r: pa.concat_tables([t, t]),
    "a row twice": lambda t, r: pa.concat_tables([t, t.slice(r.randrange(t.num_rows), 1)]),
    "zero rows": lambda t, r: t.slice(0, 0),
    "reward NaN": lambda t, r: _set_value(t, "reward", r.randrange(t.num_rows), float("nan")),
    "reward inf": lambda t, r: _set_value(t, "reward", r.randrange(t.num_rows), r.choice([1, -1]) * float("inf")),
    "reward 1e308": lambda t, r: _set_value(t, "reward", r.randrange(t.num_rows), r.choice([1e308, -1e308])),
    "metric NaN": lambda t, r: _metric_value(t, r.randrange(t.num_rows), float("nan")),
    "metric 1e308": lambda t, r: _metric_value(t, r.randrange(t.num_rows), r.choice([1e308, -1e308])),
    "info not JSON": lambda t, r: _set_info(t, r.randrange(t.num_rows), "{not json"),
    "info nested 100,000 deep": lambda t, r: _set_info(t, r.randrange(t.num_rows), "[" * 100_000 + "]" * 100_000),
    "info a list": lambda t, r: _set_info(t, r.randrange(t.num_rows), "[1, 2]"),
    "info NaN": lambda t, r: _set_info(t, r.randrange(t.num_rows), '{"answer": NaN}'),
    "info a huge number": lambda t, r: _set_info(t, r.randrange(t.num_rows), '{"answer": ' + "9" * 5000 + "}"),
    "token id huge": lambda t, r: _set_value(t, "completion_ids", r.randrange(t.num_rows), [2**31 - 1, -5]),
    "logprob NaN": lambda t, r: _set_value(t, "completion_logprobs", r.randrange(t.num_rows), [float("nan")]),
    "mask value 2": lambda t, r: _mask(t, r.randrange(t.num_rows), lambda mask: [2, *mask[1:]]),
    "mask one short": lambda t, r: _mask(t, r.randrange(t.num_rows), lambda mask: mask[:-1]),
    "num_turns huge": lambda t, r: _set_value(t, "num_turns", r.randrange(t.num_rows), r.choice([2**31 - 1, -1])),
    "sample negative": lambda t, r: _set_value(t, "sample", r.randrange(t.num_rows), -(2**31)),
    "created_at extreme": lambda t, r: _set(t, "created_at", pa.array(
        [r.choice([-(2**62), 2**62])] * t.num_rows, pa.int64()).cast(t.schema.field("created_at").type)),
    "a null where none is written": lambda t, r: _set_value(t, r.choice(REQUIRED), r.randrange(t.num_rows), None),
    "an empty string id": lambda t, r: _set_value(t, r.choice(["rollout_id", "env", "group"]),
                                                  r.randrange(t.num_rows), ""),
    "a message role unknown": lambda t, r: _set_value(t, "completion", r.randrange(t.num_rows),
                                                      [{"role": "wizard", "content": "x"}]),
}


def _mask(table: pa.Table, row: int, change: Callable[[list], list]) -> pa.Table:
    """Row `row`'s completion_mask changed, its completion_ids left as they were."""
    return _set_value(table, "completion_mask", row, change(table.column("completion_mask")[row].as_py()))


def _lie_in(name: str, how: str) -> Callable[[pa.Table, random.Random], pa.Table]:
    """A crafted table whose column `name` (a string column, `prompt.content`/`completion.content`, or a list
    column) breaks Arrow's rules in one way."""
    def craft(table: pa.Table, rng: random.Random) -> pa.Table:
        if name in LIST_COLUMNS and how == "list offsets out of range":
            array, offsets = _mutable_list(table.column(name).combine_chunks())
            table = _set(table, name, array)
            ints = memoryview(offsets).cast("i")
            ints[1] = ints[len(ints) - 1] + 1
            return table
        if "." in name:
            column = name.split(".")[0]
            messages = table.column(column).combine_chunks()
            fields = [messages.values.field(i) for i in range(messages.values.type.num_fields)]
            at = messages.values.type.get_field_index("content")
            fields[at], starts, raw = _mutable_strings(fields[at])
            structs = pa.StructArray.from_arrays(fields, fields=list(messages.values.type))
            table = _set(table, column, pa.ListArray.from_arrays(messages.offsets, structs, type=messages.type))
        else:
            array, starts, raw = _mutable_strings(table.column(name).combine_chunks())
            table = _set(table, name, array)
        _break_strings(starts, raw, rng, how)
        return table
    return craft


CRASH_CASES: dict[str, tuple[str, Callable[[pa.Table, random.Random], pa.Table]]] = {
    "task_id: offsets out of order": ("task_id", _lie_in("task_id", "offsets out of order")),
    "env: offsets past the end": ("env", _lie_in("env", "offsets past the end")),
    "rollout_id: invalid utf-8": ("rollout_id", _lie_in("rollout_id", "invalid utf-8")),
    "completion.content: negative offset": ("completion", _lie_in("completion.content", "negative offset")),
    "prompt.content: offsets out of order": ("prompt", _lie_in("prompt.content", "offsets out of order")),
    "completion.content: invalid utf-8": ("completion", _lie_in("completion.content", "invalid utf-8")),
    "prompt_ids: list offsets out of range": ("prompt_ids", _lie_in("prompt_ids", "list offsets out of range")),
    "completion: list offsets out of range": ("completion", _lie_in("completion", "list offsets out of range")),
    "info nested 100,000 deep": ("info", CRAFTED["info nested 100,000 deep"]),
    "info not JSON": ("info", CRAFTED["info not JSON"]),
    "created_at out of range": ("created_at", CRAFTED["created_at extreme"]),
    "rows repeated": ("rollout_id", CRAFTED["rows repeated"]),
}
"""Crafted shards (name -> the column at fault, how to make it) that crashed hubgym's readers before every batch
was checked: a segmentation fault (`score` on "env: offsets past the end"), tracebacks, or a silent read of
invalid data. Each is now one error line naming the file, the column and the row."""


def crash_case(name: str, data: bytes) -> bytes:
    """Shard bytes `data` rewritten as crash case `name` (deterministic)."""
    return write_table(CRASH_CASES[name][1](read_table(data), random.Random(0)))


def mutate_shard(data: bytes, rng: random.Random, values: bool = False) -> Mutation:
    """A value mutation (always, with `values`), a crafted rewrite of a shard (Arrow-valid or lying buffers), or a
    byte mutation."""
    roll = 0.5 if values else rng.random()
    if roll < 0.45:
        return mutate_bytes(data, rng)
    table = read_table(data)
    if values or roll < 0.75:
        name, table = mutate_values(table, rng)
        return Mutation(f"values: {name}", write_table(table), crafted=True)
    if rng.random() < 0.35:
        name, table = _lie(table, rng)
        return Mutation(f"crafted: {name}", write_table(table), crafted=True)
    name = rng.choice(sorted(CRAFTED))
    return Mutation(f"crafted: {name}", write_table(CRAFTED[name](table, rng)), crafted=True)


# -- the oracle ---------------------------------------------------------------------------------------------


def shard_problem(data: bytes, schema: pa.Schema, recorded_rows: int | None, seen_ids: set[str],
                  run_id: str | None = None) -> str | None:
    """Why the shard is not what a writer of rollouts could have written (None: it is valid data); `run_id`: what
    its run's manifest records."""
    values: list[dict] = []
    try:
        reader = pa.ipc.open_file(pa.BufferReader(data))
        if not reader.schema.equals(schema) or [str(f.type) for f in reader.schema] != [str(f.type) for f in schema]:
            return "another schema"  # the strings: Arrow's equality does not see a renamed list item
        rows = 0
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            batch.validate(full=True)
            rows += batch.num_rows
            for name in REQUIRED:
                if batch.column(name).null_count:
                    return f"null {name}"
            masks = batch.column("completion_mask").to_pylist()
            for ids, mask in zip(batch.column("completion_ids").to_pylist(), masks):
                if len(mask) != len(ids) or not set(mask) <= {0, 1}:
                    return "a completion mask that is not one 0 or 1 a token"
            for text in batch.column("info").storage.to_pylist():
                json.loads(text)  # as Python reads JSON: NaN is JSON to it, 100,000 levels are not
            ids = batch.column("rollout_id").to_pylist()
            if len(set(ids)) != len(ids) or seen_ids & set(ids):
                return "a rollout id twice"
            seen_ids.update(ids)
            values += batch.to_pylist()  # a date Python cannot hold is an OverflowError here: invalid data
    except (pa.ArrowException, ValueError, RecursionError, OSError, OverflowError) as exc:
        return f"{type(exc).__name__}"
    if recorded_rows is not None and rows != recorded_rows:
        return "rows differ from the recorded count"
    return values_problem(values, run_id)


RUN_MANIFEST_TYPES = {"run_id": (str, type(None)), "worker": (str,), "model": (str,), "policy_version": (int,),
                      "n": (int,), "rows": (int,), "shards": (list,), "split": (str, type(None)),
                      "schema_version": (str,), "engine": (str,), "updated_at": (str,), "kind": (str,),
                      "run_ids": (list,), "envs": (dict, type(None))}


def run_manifest_problem(data: bytes, original: bytes, run_id: str) -> str | None:
    """A run manifest's verdict: json_problem's, then each field its writers write of that type (a boolean is no
    integer), counts >= 0, `rows` the sum of its shards' rows, and a run id that is the rows' (`run_id`) or null."""
    problem = json_problem(data, original, ("shard_files",), may_lack=True)
    if problem:
        return problem
    manifest = json.loads(data.decode("utf-8"))
    if not isinstance(manifest, dict):
        return "not an object"
    for key, kinds in RUN_MANIFEST_TYPES.items():
        if key in manifest and (type(manifest[key]) not in kinds):
            return f"{key} of another type"
    for key in ("policy_version", "n", "rows"):
        if key in manifest and manifest[key] < 0:
            return f"a negative {key}"
    if any(type(v) is not str for key in ("shards", "run_ids") for v in manifest.get(key) or []):
        return "a shard or run name that is not a string"
    if any(type(v) is not dict for v in (manifest.get("envs") or {}).values()):
        return "an env entry that is not an object"
    files = manifest.get("shard_files")
    if "rows" in manifest and isinstance(files, dict) and files:
        if manifest["rows"] != sum(entry["rows"] for entry in files.values()):
            return "rows that are not the sum of its shards'"
    if manifest.get("run_id") not in (None, run_id):
        return "a run id other than its rows'"
    return None


def index_problem(data: bytes, original: bytes) -> str | None:
    """index.json's verdict: json_problem's, then `rows` (where present) an integer, the sum of its shards'."""
    problem = json_problem(data, original, ("shards",))
    if problem:
        return problem
    index = json.loads(data.decode("utf-8"))
    if "rows" in index:
        if type(index["rows"]) is not int:
            return "rows of another type"
        if index["rows"] != sum(entry["rows"] for entry in index["shards"].values()):
            return "rows that are not the sum of its shards'"
    return None


def json_problem(data: bytes, original: bytes, keys: tuple[str, ...], *, may_lack: bool = False) -> str | None:
    """Why a JSON file is not valid (None: valid): not UTF-8 JSON (as Python's json reads it: NaN is JSON to it,
    and hubgym writes with it), or one of `keys` (dotted paths to what its readers trust it for: a manifest's shard
    records, an env manifest's verifier file and sha256) no longer what it was. `may_lack`: a key gone altogether
    is valid (a run manifest without `shard_files` records no shard, as the online steps' manifests do: the shards
    are then read without a recorded sha256, every batch checked all the same)."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return type(exc).__name__
    before = json.loads(original)
    for key in keys:
        if may_lack and isinstance(value, dict) and key not in value:
            continue
        if _at(value, key) != _at(before, key):
            return f"{key} changed"
    return None


def _at(value: Any, path: str) -> Any:
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
