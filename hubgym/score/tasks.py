"""The tasks of stored rows, decoded once per task: the rows of a group share one task object.

    tasks = decode_tasks(rows)          # rows: a `slim` batch or table; one task dict per row

A run stores n samples per task, each row repeating the task's id, env, prompt, interaction and info.
Decoding them (`to_pylist`, `info` parsed) is most of what a re-score spends outside the reward code, so
each task is decoded once and its rows share the object, as the rollout loop scores a group's samples
with one task object (verifiers must leave it as it is; the conformance checks hold them to that).

Stored rows are untrusted: a shared id proves nothing. A row shares its task id's first row's object
only where every task column holds exactly the same value (`equal_rows`: compared in Arrow, strings
byte for byte, floats bit for bit); any other row is decoded on its own.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hubgym.schemas.tasks import parse_json

TASK_COLUMNS = ("task_id", "env", "prompt", "interaction", "info")


def decode_tasks(rows: pa.RecordBatch | pa.Table) -> list[dict]:
    """Each row's task dict (`info` parsed); rows holding the same task share one dict."""
    columns = {name: _array(rows.column(name)) for name in TASK_COLUMNS}
    first = first_of_each_task(columns)
    wanted = np.unique(first)  # the rows decoded: each task's first row, and rows that differ from it
    picked = pa.array(wanted, pa.int64())
    ids, envs, prompts, interactions, infos = (columns[name].take(picked).to_pylist() for name in TASK_COLUMNS)
    decoded = [{"id": task_id, "env": env, "prompt": prompt, "interaction": interaction,
                "info": parse_json(info) if isinstance(info, str) else info}
               for task_id, env, prompt, interaction, info in zip(ids, envs, prompts, interactions, infos)]
    position = np.empty(len(first), np.int64)
    position[wanted] = np.arange(len(wanted))
    return [decoded[k] for k in position[first].tolist()]


def first_of_each_task(columns: dict[str, pa.Array]) -> np.ndarray:
    """For each row, the row whose task object it shares: the first row with its task id when every task column
    holds the same value there, else itself."""
    codes = pc.fill_null(pc.dictionary_encode(columns["task_id"]).indices, -1).to_numpy(zero_copy_only=False)
    _, firsts, which = np.unique(codes, return_index=True, return_inverse=True)
    first = firsts[which]
    if (first != np.arange(len(first))).any():
        same = np.ones(len(first), bool)
        for name in TASK_COLUMNS[1:]:
            same &= equal_rows(columns[name], first)
        first[~same] = np.flatnonzero(~same)
    return first


def equal_rows(array: pa.Array, other: np.ndarray) -> np.ndarray:
    """equal[i]: rows i and other[i] of `array` hold exactly the same value, so they decode to equal Python values:
    nulls equal nulls, strings compare byte for byte, floats bit for bit (NaN equals NaN, -0.0 differs from 0.0).
    Types it does not know compare unequal (those rows are then decoded on their own). Every row is compared, so
    each level takes only the `other` side (a row compared with itself is equal)."""
    if array.null_count == len(array):
        return np.ones(len(array), bool)
    equal = _equal_values(array, other)
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        equal = np.where(valid & valid[other], equal, valid == valid[other])
    return equal


def _equal_values(array: pa.Array, other: np.ndarray) -> np.ndarray:
    """equal_rows where both rows are valid (what it gives for a null row is decided by the caller)."""
    kind = array.type
    if pa.types.is_struct(kind):
        equal = np.ones(len(array), bool)
        for i in range(kind.num_fields):
            equal &= equal_rows(array.field(i), other)
        return equal
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _equal_lists(array, other)
    if pa.types.is_floating(kind):
        bits = {16: np.int16, 32: np.int32, 64: np.int64}[kind.bit_width]
        mine = array.to_numpy(zero_copy_only=False).view(bits)
        return mine == mine[other]
    if pa.types.is_null(kind):
        return np.ones(len(array), bool)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or \
            pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        same = pc.equal(array, array.take(pa.array(other)))
        return pc.fill_null(same, False).to_numpy(zero_copy_only=False).astype(bool)  # null: by validity
    return np.arange(len(array)) == other


def _equal_lists(array: pa.ListArray, other: np.ndarray) -> np.ndarray:
    """Lists of the same length whose items are equal pairwise (compared all at once in the child array)."""
    offsets = array.offsets.to_numpy(zero_copy_only=False)  # sliced with the array; they index `values`
    lengths = np.diff(offsets)
    equal = lengths == lengths[other]
    values = array.values
    if not len(values):
        return equal
    base, end = offsets[0], offsets[-1]
    counts = np.where(equal, lengths, 0)  # items of rows of unequal length are compared with themselves
    owner = np.repeat(np.arange(len(lengths)), lengths)
    step = np.arange(end - base) - (offsets[owner] - base)  # each item's place in its list
    item_other = np.arange(len(values))
    paired = np.repeat(counts > 0, lengths)
    item_other[base:end][paired] = offsets[other[owner[paired]]] + step[paired]
    items = equal_rows(values, item_other)
    equal[owner[~items[base:end]]] = False
    return equal


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array (a table's column may come in chunks), extension types as their storage."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array.storage if isinstance(array, pa.ExtensionArray) else array
