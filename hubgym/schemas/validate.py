"""Validate task and rollout tables: Arrow types first, then values with pandera (polars backend).

Every failure names env, config, split, row id and field, and says how to fix it.
"""

from __future__ import annotations

from typing import Callable

import pandera.polars as pa
import polars as pl
import pyarrow as pyarrow

from hubgym.errors import SchemaError, Where
from hubgym.schemas.messages import ROLES
from hubgym.schemas.rollouts import ERROR_BOUNDARIES, ROLLOUT_SCHEMA
from hubgym.schemas.tasks import KINDS, TASK_SCHEMA

_FIXES: dict[str, str] = {}
"""How to fix a failed check, by check name (pandera reports the name, we add the fix)."""


def _rowwise(field: str, expr: Callable[[str], pl.Expr], fix: str) -> pa.Check:
    """A row-wise check on one column whose name (`field`) is the nested path it inspects."""
    _FIXES[field] = fix
    return pa.Check(lambda data: data.lazyframe.select(expr(data.key).fill_null(True)), name=field)


def _all_roles_valid(col: str) -> pl.Expr:
    return pl.col(col).list.eval(pl.element().struct.field("role").is_in(ROLES)).list.all()


_MESSAGES_FIX = (f"every message needs role in {ROLES}; "
                 "build messages with hubgym.schemas.messages (user(), assistant(), ...)")

TASK_VALUES = pa.DataFrameSchema(
    {
        "id": pa.Column(pl.Utf8, nullable=False, unique=True, checks=pa.Check.str_length(min_value=1)),
        "env": pa.Column(pl.Utf8, nullable=False, checks=pa.Check.str_length(min_value=1)),
        "prompt": pa.Column(
            nullable=False,
            checks=[
                _rowwise("prompt", lambda c: pl.col(c).list.len() > 0, "a prompt needs at least one message"),
                _rowwise("prompt.role", _all_roles_valid, _MESSAGES_FIX),
            ],
        ),
        "interaction": pa.Column(
            nullable=False,
            checks=[
                _rowwise("interaction.kind", lambda c: pl.col(c).struct.field("kind").is_in(KINDS),
                         f"interaction.kind must be one of {KINDS}; use hubgym.interaction(kind=...)"),
                _rowwise("interaction.max_turns", lambda c: pl.col(c).struct.field("max_turns") >= 1,
                         "interaction.max_turns must be >= 1"),
                _rowwise("interaction.tool_rewards",
                         lambda c: pl.col(c).struct.field("tool_rewards").list.eval(
                             pl.element().struct.field("max_calls") >= 1).list.all(),
                         "each tool_rewards entry needs max_calls >= 1"),
            ],
        ),
    },
    strict=False,
)

ROLLOUT_VALUES = pa.DataFrameSchema(
    {
        "rollout_id": pa.Column(pl.Utf8, nullable=False, unique=True),
        "task_id": pa.Column(pl.Utf8, nullable=False),
        "env": pa.Column(pl.Utf8, nullable=False),
        "group": pa.Column(pl.Utf8, nullable=False),
        "sample": pa.Column(pl.Int32, checks=pa.Check.ge(0)),
        "completion": pa.Column(checks=_rowwise("completion.role", _all_roles_valid, _MESSAGES_FIX)),
        "completion_ids": pa.Column(
            checks=[
                _rowwise("completion_mask",
                         lambda c: pl.col(c).list.len() == pl.col("completion_mask").list.len(),
                         "completion_ids, completion_mask and completion_logprobs must have equal lengths"),
                _rowwise("completion_logprobs",
                         lambda c: pl.col(c).list.len() == pl.col("completion_logprobs").list.len(),
                         "completion_ids, completion_mask and completion_logprobs must have equal lengths"),
            ]
        ),
        "completion_mask": pa.Column(checks=_rowwise(
            "completion_mask", lambda c: pl.col(c).list.eval(pl.element().is_in([0, 1])).list.all(),
            "completion_mask holds only 0 (tool/env token) and 1 (model token)")),
        "reward": pa.Column(nullable=True, checks=_rowwise(
            "reward", lambda c: pl.col(c).is_not_null() | pl.col("error").is_not_null(),
            "a row without a reward must record why in `error`")),
        "error": pa.Column(nullable=True, checks=_rowwise(
            "error.boundary", lambda c: pl.col(c).struct.field("boundary").is_in(ERROR_BOUNDARIES),
            f"error.boundary must be one of {ERROR_BOUNDARIES}")),
    },
    strict=False,
)


def check_arrow_schema(actual: pyarrow.Schema, expected: pyarrow.Schema, where: Where, what: str) -> None:
    """Raise SchemaError naming the first column that is missing, extra or of the wrong type."""
    for field in expected:
        if field.name not in actual.names:
            raise SchemaError(f"{what} column {field.name!r} is missing",
                              Where(**{**where.__dict__, "field": field.name}),
                              f"emit every column of the {what} schema (hubgym.schemas)")
        got = actual.field(field.name).type
        if not got.equals(field.type):
            raise SchemaError(
                f"{what} column {field.name!r} has type {got}, expected {field.type}",
                Where(**{**where.__dict__, "field": field.name}),
                f"declare features with hubgym.schemas (do not override _info) and yield values of type {field.type}",
            )
    extra = [n for n in actual.names if n not in expected.names]
    if extra:
        raise SchemaError(f"{what} has unexpected columns {extra}", Where(**{**where.__dict__, "field": extra[0]}),
                          "remove them, or put extra data inside `info`")


def _validate_values(table: pyarrow.Table, schema: pa.DataFrameSchema, id_column: str, where: Where) -> None:
    frame = pl.from_arrow(table.drop_columns([c for c in ("info",) if c in table.column_names]))
    try:
        schema.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        raise _schema_error(exc.failure_cases, frame, schema, id_column, where) from None


def _schema_error(cases: pl.DataFrame, frame: pl.DataFrame, schema, id_column: str, where: Where) -> SchemaError:
    first = cases.row(0, named=True)
    index = first.get("index")
    row_id = frame[id_column][int(index)] if index is not None and id_column in frame.columns else None
    check = first["check"] or ""
    field = check if "." in check or check in frame.columns else first["column"]
    fix = _FIXES.get(check, f"see the {first['column']!r} column in hubgym.schemas")
    more = f" ({len(cases) - 1} more failures)" if len(cases) > 1 else ""
    what = f"value check {check!r} failed on {first['column']!r}: {str(first['failure_case'])[:120]}{more}"
    return SchemaError(what, Where(where.env, where.config, where.split, row_id, field), fix)


def validate_tasks(table: pyarrow.Table, where: Where = Where()) -> None:
    """Raise SchemaError if `table` is not a valid task table (types, then values)."""
    check_arrow_schema(table.schema, TASK_SCHEMA, where, "task")
    _validate_values(table, TASK_VALUES, "id", where)


def validate_rollouts(table: pyarrow.Table, where: Where = Where()) -> None:
    """Raise SchemaError if `table` is not a valid rollout table (types, then values)."""
    check_arrow_schema(table.schema, ROLLOUT_SCHEMA, where, "rollout")
    _validate_values(table, ROLLOUT_VALUES, "rollout_id", where)
