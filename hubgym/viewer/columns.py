"""Columns the viewer's index derives from a shard's record batch, whole columns at a time (Arrow compute and numpy,
no Python per row): the model tokens a row sampled (its length, to sort by) and a one-line preview of its last reply.

    model_tokens(batch.column("completion_mask"))   # int64 per row: how many completion tokens have mask 1
    previews(batch.column("completion"))            # string per row: the last assistant turn, one line, cut short
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PREVIEW_CHARS = 100  # characters of a reply kept in the index (a table line, not the reply)
WHITE = r"[\s\x00-\x1f\x7f]+"  # whitespace and control characters: one space each run, so a preview is one line


def model_tokens(mask: pa.Array) -> pa.Array:
    """Per row, the completion tokens the model sampled (mask 1): what "length" sorts by."""
    flat = pc.list_flatten(mask)
    counts = np.zeros(len(mask), np.int64)
    if len(flat):
        parents = pc.list_parent_indices(mask).to_numpy()
        values = pc.fill_null(flat, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        counts = np.bincount(parents, weights=values, minlength=len(mask)).astype(np.int64)
    return pa.array(counts, pa.int64())


def previews(completion: pa.Array, chars: int = PREVIEW_CHARS) -> pa.Array:
    """Per row, the last assistant turn as one line (runs of whitespace and control characters made one space) of
    at most `chars` characters; a turn that is all tool calls reads `-> name(...)`; null when the row has none."""
    rows = len(completion)
    flat = pc.list_flatten(completion)
    if not len(flat):
        return pa.nulls(rows, pa.string())
    parents = pc.list_parent_indices(completion).to_numpy()
    assistant = np.flatnonzero(pc.fill_null(pc.equal(flat.field("role"), "assistant"), False).to_numpy(
        zero_copy_only=False))
    if not len(assistant):
        return pa.nulls(rows, pa.string())
    # the last assistant message of each row: the first occurrence of its row when read backwards
    owners, first_backwards = np.unique(parents[assistant][::-1], return_index=True)
    last = assistant[::-1][first_backwards]
    chosen = flat.take(pa.array(last, pa.int64()))
    text = pc.utf8_trim_whitespace(pc.replace_substring_regex(pc.fill_null(chosen.field("content"), ""), WHITE, " "))
    called = pc.binary_join_element_wise("-> ", _first_call_names(chosen.field("tool_calls")), "(...)", "")
    shown = pc.if_else(pc.and_(pc.equal(text, ""), pc.is_valid(called)), called, text)
    shown = pc.utf8_slice_codeunits(shown, 0, chars)
    where = np.full(rows, -1, np.int64)
    where[owners] = np.arange(len(owners))
    return shown.take(pa.array(where, pa.int64(), mask=where < 0))


def _first_call_names(calls: pa.Array) -> pa.Array:
    """Per message, the name of its first tool call (null when it has none)."""
    names = pa.nulls(len(calls), pa.string())
    flat = pc.list_flatten(calls)
    if len(flat):
        parents = pc.list_parent_indices(calls).to_numpy()
        owners, first = np.unique(parents, return_index=True)
        where = np.full(len(calls), -1, np.int64)
        where[owners] = first
        names = flat.field("name").take(pa.array(where, pa.int64(), mask=where < 0))
    return names
