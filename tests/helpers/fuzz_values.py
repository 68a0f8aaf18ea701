"""Value mutations of stored rollout shards, and the oracle's own reading of the row contract.

A value mutation keeps a shard valid Arrow of the rollout schema and changes what a cell holds: a number out of
range, not finite, negative; a list one value short or long; a string empty, a path, or holding terminal escapes;
a cell copied from another row (another env, task, run or sample: groups that no longer hold one task); a reward
set on a failed row. Some are valid data (a reward within range, a sample index moved within its group); the
oracle (`row_problem`, `group_problem`) says which, written here apart from hubgym's code, rule by rule, with
plain Python over the rows, so a reader that lets an invalid value through shows as a silent success.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any, Callable

import pyarrow as pa

INT32 = 2**31
KINDS = ("single_turn", "tool_use", "multi_turn")
BOUNDARIES = ("engine", "tool", "verifier", "parse", "env")
ENV_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}(-v[1-9][0-9]{0,8})?")  # a name, or a versioned id
HOSTILE_STRINGS = ["", "\x1b[31mred\x1b[0m", "../../evil", "a" * 10_000, "\u202eevil", "env-with-dash", "é",
                   "arithmetic", "wordle", "calc_tools", "x\x00y", "\r\n"]
HOSTILE_INTS = [-1, -(2**31), 2**31 - 1, 0, 1, 7]
HOSTILE_FLOATS = [float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 1.7e308, -1.7e308, 2.0**53 + 2, 0.5, -0.5,
                  0.0, -0.0, 1e-45, 5.0]


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


def _table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows back into the shard's schema (the `info` JSON column through its storage type)."""
    columns = []
    for field in schema:
        values = [row[field.name] for row in rows]
        if isinstance(field.type, pa.BaseExtensionType):
            columns.append(pa.ExtensionArray.from_storage(field.type, pa.array(values, field.type.storage_type)))
        else:
            columns.append(pa.array(values, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _cell(rows: list[dict], rng: random.Random) -> dict:
    return rows[rng.randrange(len(rows))]


def _list_change(values: list, rng: random.Random, pool: list) -> tuple[str, list]:
    """A list cell changed: a value replaced by one of `pool`, one value dropped or added, or emptied."""
    how = rng.choice(["replace", "replace", "drop", "add", "empty"])
    values = list(values)
    if how == "replace" and values:
        at = rng.randrange(len(values))
        values[at] = rng.choice(pool)
    elif how == "drop" and values:
        values.pop(rng.randrange(len(values)))
    elif how == "add":
        values.insert(rng.randrange(len(values) + 1), rng.choice(pool))
    else:
        values = []
    return how, values


def _token_list(column: str, pool: list) -> Callable[[list[dict], random.Random], str]:
    def change(rows: list[dict], rng: random.Random) -> str:
        row = _cell(rows, rng)
        how, row[column] = _list_change(row[column] or [], rng, pool)
        return f"{column}: {how}"
    return change


def _scalar(column: str, pool: list) -> Callable[[list[dict], random.Random], str]:
    def change(rows: list[dict], rng: random.Random) -> str:
        row, value = _cell(rows, rng), rng.choice(pool)
        row[column] = value
        return f"{column} = {value!r:.30}"
    return change


def _struct_field(column: str, name: str, pool: list) -> Callable[[list[dict], random.Random], str]:
    def change(rows: list[dict], rng: random.Random) -> str:
        row, value = _cell(rows, rng), rng.choice(pool)
        row[column] = {**(row[column] or {}), name: value}
        return f"{column}.{name} = {value!r:.30}"
    return change


def _metric(rows: list[dict], rng: random.Random) -> str:
    row, value = _cell(rows, rng), rng.choice(HOSTILE_FLOATS)
    if not row["metrics"]:
        return "metrics: none to change"
    row["metrics"][rng.randrange(len(row["metrics"]))]["value"] = value
    return f"metric = {value!r}"


def _copied(rows: list[dict], rng: random.Random) -> str:
    """A cross-row change: one row's env, task id, run id, group or sample taken from another row."""
    column = rng.choice(["env", "task_id", "run_id", "group", "sample", "sample"])
    if len(rows) < 2:
        return "copy: one row"
    a, b = rng.sample(range(len(rows)), 2)
    rows[a][column] = rows[b][column]
    return f"{column} of row {a} copied from row {b}"


def _failed_with_reward(rows: list[dict], rng: random.Random) -> str:
    row = _cell(rows, rng)
    if row["error"] is None:
        row["error"] = {"boundary": rng.choice([*BOUNDARIES, "rollout", ""]), "type": "X", "message": "m"}
        if rng.random() < 0.5:
            row["reward"] = None
        return f"error set (boundary {row['error']['boundary']!r}, reward {row['reward']!r})"
    row["reward"] = rng.choice([0.0, 1.0])
    return "a reward on a failed row"


def _completion_emptied(rows: list[dict], rng: random.Random) -> str:
    row = _cell(rows, rng)
    row["completion"] = []
    return "completion emptied"


VALUE_MUTATIONS: dict[str, Callable[[list[dict], random.Random], str]] = {
    "prompt_ids": _token_list("prompt_ids", [-5, -1, INT32 - 1, 2**20, 0, 3]),
    "completion_ids": _token_list("completion_ids", [-5, -1, INT32 - 1, 2**20, 0, 3]),
    "completion_mask": _token_list("completion_mask", [-1, 2, 127, 0, 1]),
    "completion_logprobs": _token_list("completion_logprobs", HOSTILE_FLOATS),
    "sample": _scalar("sample", HOSTILE_INTS),
    "num_turns": _scalar("num_turns", HOSTILE_INTS),
    "reward": _scalar("reward", [*HOSTILE_FLOATS, None]),
    "env": _scalar("env", HOSTILE_STRINGS),
    "task_id": _scalar("task_id", HOSTILE_STRINGS),
    "run_id": _scalar("run_id", HOSTILE_STRINGS),
    "group": _scalar("group", HOSTILE_STRINGS),
    "rollout_id": _scalar("rollout_id", HOSTILE_STRINGS[:5]),
    "interaction.kind": _struct_field("interaction", "kind", ["../../evil", "", None, *KINDS]),
    "interaction.max_turns": _struct_field("interaction", "max_turns", [0, -1, 1, 2**31 - 1]),
    "timings": _struct_field("timings", "generate_s", HOSTILE_FLOATS),
    "provenance.policy_version": _struct_field("provenance", "policy_version", [-1, 0, 2**62]),
    "metrics": _metric,
    "a cell of another row": _copied,
    "error and reward": _failed_with_reward,
    "completion emptied": _completion_emptied,
}


def mutate_values(table: pa.Table, rng: random.Random) -> tuple[str, pa.Table]:
    """One to three value mutations of a shard's table (its schema kept)."""
    rows = _rows(table)
    names = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        name = rng.choice(sorted(VALUE_MUTATIONS))
        names.append(VALUE_MUTATIONS[name](rows, rng))
    return "; ".join(names), _table(rows, table.schema)


# -- the oracle ----------------------------------------------------------------------------------------------------


def _finite(x: Any) -> bool:
    return x is None or isinstance(x, (int, float)) and math.isfinite(x)


def row_problem(row: dict[str, Any]) -> str | None:
    """Why a row breaks the row contract as the issue states it (None: it keeps it)."""
    ids, mask, lps = row["completion_ids"] or [], row["completion_mask"] or [], row["completion_logprobs"] or []
    checks = [
        (all(row[c] for c in ("rollout_id", "run_id", "task_id", "group")), "an empty id"),
        (bool(ENV_NAME.fullmatch(row["env"])), "env is not an env name"),
        (row["sample"] >= 0, "a negative sample index"),
        (all(0 <= i < INT32 for i in (row["prompt_ids"] or []) + ids), "a token id outside [0, 2^31)"),
        (bool(row["prompt_ids"]) or not ids, "completion ids without prompt ids"),
        (bool(row["completion"]) or not ids, "completion ids without a completion"),
        (len(mask) == len(ids), "a mask of another length than the ids"),
        (all(m in (0, 1) for m in mask), "a mask value other than 0 and 1"),
        (len(lps) in (0, len(ids)), "logprobs neither one per token nor none"),
        (all(x is None or math.isfinite(x) and x <= 0 for x in lps), "a logprob that is not finite and <= 0"),
        (row["num_turns"] >= 0, "a negative count"),
        ((row["interaction"] or {}).get("kind") in KINDS, "an unknown interaction kind"),
        ((row["interaction"] or {}).get("max_turns") is None or row["interaction"]["max_turns"] >= 1,
         "max_turns below 1"),
        ((row["reward"] is None) == (row["error"] is not None), "a reward on a failed row, or none on a scored one"),
        (row["error"] is None or row["error"].get("boundary") in BOUNDARIES, "an unknown error boundary"),
        (all(_finite(m.get("value")) for m in row["metrics"] or []), "a metric that is not finite"),
        (all(x is None or math.isfinite(x) and x >= 0 for x in (row["timings"] or {}).values()),
         "a timing that is not a finite duration"),
        ((row["provenance"] or {}).get("policy_version") is None or row["provenance"]["policy_version"] >= 0,
         "a negative policy version"),
    ]
    return next((problem for ok, problem in checks if not ok), None)


def group_problem(rows: list[dict[str, Any]]) -> str | None:
    """Why the rows of a shard break a group rule (one env, task and run per group; each sample once)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    for members in groups.values():
        for column in ("env", "task_id", "run_id"):
            if len({m[column] for m in members}) > 1:
                return f"a group of two {column}s"
        if len({m["sample"] for m in members}) < len(members):
            return "a sample index twice in a group"
    return None


def values_problem(rows: list[dict[str, Any]], run_id: str | None) -> str | None:
    """The oracle's verdict on a shard's values (its rows), given the run id its run's manifest records."""
    for row in rows:
        problem = row_problem(row)
        if problem:
            return problem
        if run_id is not None and row["run_id"] != run_id:
            return "a run id other than the manifest's"
    return group_problem(rows)
