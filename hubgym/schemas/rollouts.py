"""The Rollout row: one sampled trajectory, with everything needed to re-score and to train.

Token record invariant: `len(completion_ids) == len(completion_mask) == len(completion_logprobs)`;
mask 1 marks tokens the model sampled, mask 0 marks tool and environment tokens (their
logprobs are 0.0 and they get no gradient).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

import datasets

import pyarrow as pa

from hubgym.schemas.messages import MESSAGE_FEATURES, REPLY_FEATURES, Message
from hubgym.schemas.tasks import INTERACTION_FEATURES, Interaction

ERROR_BOUNDARIES: tuple[str, ...] = ("engine", "tool", "verifier", "parse", "env")


class RowError(TypedDict):
    """What failed while producing or scoring a row. A row with an error is left out of advantages."""

    boundary: str  # one of ERROR_BOUNDARIES: which component failed
    type: str  # exception class name
    message: str


class Metric(TypedDict):
    name: str
    value: float


class Provenance(TypedDict):
    model: str
    policy_version: int
    sampling: str  # JSON of the sampling arguments
    env_repo: str | None
    env_revision: str | None
    verifier_module: str
    verifier_sha256: str
    env_code_sha256: str | None  # a hub env's pin: the sha256 over its code files (verifier, tools)
    engine: str
    engine_version: str
    chat_template_sha256: str | None


class Timings(TypedDict):
    generate_s: float
    tools_s: float
    score_s: float
    total_s: float


class Rollout(TypedDict):
    """One stored trajectory, a row of a rollout shard: the task it answered, its messages, the token record the
    trainer learns from (ids, sampling logprobs, the mask of sampled tokens), the verifier's reward with its
    named components, and provenance (model, engine, sampling, env code hash). Everything a re-score, a replay
    or an offline GRPO step needs, with no engine or env code at hand."""

    rollout_id: str
    run_id: str
    task_id: str
    env: str
    group: str
    sample: int
    prompt: list[Message]
    completion: list[Message]
    info: dict[str, Any]
    interaction: Interaction
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float]
    tokens_consistent: bool
    reward: float | None
    metrics: list[Metric]
    finish_reason: str
    truncated: bool
    num_turns: int
    error: RowError | None
    provenance: Provenance
    timings: Timings
    created_at: datetime


ROLLOUT_FEATURES = datasets.Features(
    {
        "rollout_id": datasets.Value("string"),
        "run_id": datasets.Value("string"),
        "task_id": datasets.Value("string"),
        "env": datasets.Value("string"),
        "group": datasets.Value("string"),
        "sample": datasets.Value("int32"),
        "prompt": datasets.List(MESSAGE_FEATURES),
        "completion": datasets.List(REPLY_FEATURES),
        "info": datasets.Json(),
        "interaction": INTERACTION_FEATURES,
        "prompt_ids": datasets.List(datasets.Value("int32")),
        "completion_ids": datasets.List(datasets.Value("int32")),
        "completion_mask": datasets.List(datasets.Value("int8")),
        "completion_logprobs": datasets.List(datasets.Value("float32")),
        "tokens_consistent": datasets.Value("bool"),
        "reward": datasets.Value("float64"),
        "metrics": datasets.List({"name": datasets.Value("string"), "value": datasets.Value("float64")}),
        "finish_reason": datasets.Value("string"),
        "truncated": datasets.Value("bool"),
        "num_turns": datasets.Value("int32"),
        "error": {
            "boundary": datasets.Value("string"),
            "type": datasets.Value("string"),
            "message": datasets.Value("string"),
        },
        "provenance": {
            "model": datasets.Value("string"),
            "policy_version": datasets.Value("int64"),
            "sampling": datasets.Value("string"),
            "env_repo": datasets.Value("string"),
            "env_revision": datasets.Value("string"),
            "verifier_module": datasets.Value("string"),
            "verifier_sha256": datasets.Value("string"),
            "engine": datasets.Value("string"),
            "engine_version": datasets.Value("string"),
            "chat_template_sha256": datasets.Value("string"),
            "env_code_sha256": datasets.Value("string"),
        },
        "timings": {
            "generate_s": datasets.Value("float64"),
            "tools_s": datasets.Value("float64"),
            "score_s": datasets.Value("float64"),
            "total_s": datasets.Value("float64"),
        },
        "created_at": datasets.Value("timestamp[us, tz=UTC]"),
    }
)
ROLLOUT_SCHEMA = ROLLOUT_FEATURES.arrow_schema
ROLLOUT_COLUMNS: tuple[str, ...] = tuple(ROLLOUT_FEATURES)
LEGACY_TYPES: dict[str, pa.DataType] = {
    "completion": datasets.Features({"c": datasets.List(MESSAGE_FEATURES)}).arrow_schema.field("c").type,
    "provenance": pa.struct([f for f in ROLLOUT_SCHEMA.field("provenance").type if f.name != "env_code_sha256"]),
}
"""Column types of shards written before a field was added: `completion` messages without `reasoning`, and
`provenance` without `env_code_sha256`; `upgrade_batch` reads them with the new field null."""


def column_type_ok(name: str, actual: pa.DataType) -> bool:
    """Whether a stored column has the rollout schema's type (or an older one `upgrade_batch` reads), the names of
    its list items included."""
    expected = [ROLLOUT_SCHEMA.field(name).type, *([LEGACY_TYPES[name]] if name in LEGACY_TYPES else [])]
    return any(actual.equals(t) and _item_names_match(actual, t) for t in expected)


def _item_names_match(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Arrow calls two list types equal whatever their item field is named, but a reader that uses the name
    (polars) meets whatever bytes the file holds there, valid UTF-8 or not."""
    if pa.types.is_list(expected) or pa.types.is_large_list(expected):
        try:
            name = actual.value_field.name
        except UnicodeDecodeError:
            return False
        return name == expected.value_field.name and _item_names_match(actual.value_type, expected.value_type)
    if pa.types.is_struct(expected):
        return all(_item_names_match(actual.field(i).type, expected.field(i).type) for i in range(expected.num_fields))
    return True


def upgrade_schema(schema: pa.Schema) -> pa.Schema:
    """The schema `upgrade_batch` gives a stored batch of this schema."""
    for name, legacy in LEGACY_TYPES.items():
        at = schema.get_field_index(name)
        if at >= 0 and schema.field(at).type.equals(legacy):
            schema = schema.set(at, ROLLOUT_SCHEMA.field(name))
    return schema


def upgrade_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A stored batch with today's column types: an older shard's new fields are null."""
    for name, legacy in LEGACY_TYPES.items():
        at = batch.schema.get_field_index(name)
        if at >= 0 and batch.schema.field(at).type.equals(legacy):
            batch = batch.set_column(at, ROLLOUT_SCHEMA.field(name), _upgraded(batch.column(at), name))
    return batch


def _upgraded(old: pa.Array, name: str) -> pa.Array:
    """`old` (a legacy column) with the fields it lacks added as nulls."""
    if name == "provenance":
        return _with_null_fields(old, ROLLOUT_SCHEMA.field(name).type)
    structs = _with_null_fields(old.values, ROLLOUT_SCHEMA.field(name).type.value_type)  # completion: list<message>
    return pa.ListArray.from_arrays(old.offsets, structs, type=ROLLOUT_SCHEMA.field(name).type,
                                    mask=old.is_null() if old.null_count else None)


def _with_null_fields(structs: pa.StructArray, target: pa.StructType) -> pa.StructArray:
    """The struct array with target's fields, in target's order; those it lacks are all null."""
    have = {structs.type.field(i).name: structs.field(i) for i in range(structs.type.num_fields)}
    fields = [have.get(f.name, pa.nulls(len(structs), f.type)) for f in target]
    return pa.StructArray.from_arrays(fields, fields=list(target),
                                      mask=structs.is_null() if structs.null_count else None)
