"""What a stored rollout shard must hold before any of its values is used: checked once, where its bytes open.

    check = ShardCheck("r1/shards/w000of001-00000.arrow", run_ids=frozenset({"r1"}), vocab_size=None)
    check.batch(batch, first_row=0)                # ShardError naming column, row and rule, or nothing
    check.finish()                                 # the rules that span a shard's rows (its groups)
    seen = SeenRollouts(); seen.add(shard, ids)     # a rollout id already read from another shard: ShardError
    batch = as_read(batch)                         # what readers hand out: today's types, non-finite rewards as errors

A recorded sha256 says the bytes are those someone recorded, not that hubgym's writer wrote them: the run
manifest and a rollout repo's index.json are as untrusted as the shard. So every record batch gets pyarrow's
full validation (offsets, UTF-8, child lengths and null counts: what keeps a crafted file from crashing a
reader in native code, or from being read as something else), column by column, then the writer's own rules:
no null where it never writes one, an `info` that decodes as JSON (nested at most MAX_JSON_DEPTH deep), a
date Python holds, and no rollout id twice (in a shard, or across the shards of a read: SeenRollouts). Then
the row contract (hubgym.schemas.row_contract): the values the writer guarantees and the trainer relies on
(token ids, logprobs, masks, counts, kinds, one task per group, the run id its manifest records). A failure is
one ShardError naming the shard, the column, the row and the rule.

A reward that is not finite (or past MAX_ABS_REWARD, where a group's sums overflow) is valid Arrow, but it is no
reward: `as_read` hands the row out as the rollout loop would have stored it, without a reward and with a
verifier error naming the value, so every reader counts it in `errors` and training leaves it out.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from hubgym.errors import ShardError
from hubgym.schemas.row_contract import GROUP_COLUMNS, MAX_ABS_REWARD, Breach, first_breach, group_breach, shown
from hubgym.schemas.rollouts import ROLLOUT_SCHEMA, upgrade_batch
from hubgym.schemas.tasks import parse_json

_DECODE = msgspec.json.Decoder().decode

FIX = "re-run the rollout (it resumes and rewrites only what is missing) and push the run again"
REQUIRED = ("rollout_id", "run_id", "task_id", "env", "group", "sample", "prompt", "completion", "info",
            "interaction", "prompt_ids", "completion_ids", "completion_mask", "completion_logprobs",
            "finish_reason", "truncated", "num_turns", "provenance", "timings", "created_at")
"""Columns hubgym's writer never leaves null (the rest may be null: a failed row has no reward, say)."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of an `info` value: the deepest a built-in env writes is 6; deeper input would reach
Python's recursion limit in the code that walks it (a verifier, canonical_json, a deep copy)."""
NON_FINITE_REWARD = "NonFiniteReward"


def check_batch(batch: pa.RecordBatch, shard: str, first_row: int, ids: set[str], *, vocab_size: int | None = None,
                run_ids: frozenset[str] | None = None) -> None:
    """ShardError naming the column, row and rule of the first thing in `batch` that no hubgym writer writes.

    `first_row`: the shard's row number of the batch's first row; `ids`: the shard's rollout ids so far (this
    batch's are added); `vocab_size`: the token ids are also held below it (a tokenizer is known); `run_ids`: the
    run ids its run's manifest records. Each check runs on whole columns in Arrow (a few calls a batch); only a
    failure looks for its row. The group rules span a shard's batches: ShardCheck runs them."""
    for name, column in zip(batch.schema.names, batch.columns):
        try:
            column.validate(full=True)
        except pa.ArrowException as exc:
            row = first_row + first_invalid_row(column)
            raise _error(shard, name, row, f"is not valid Arrow ({_first_line(exc)})", rule="valid-arrow") from None
    for name in REQUIRED:
        column = batch.column(name)
        if column.null_count:
            raise _error(shard, name, first_row + _first_true(pc.is_null(column)),
                         "is null, which hubgym's writer never writes", rule="not-null")
    _check_times(batch.column("created_at"), shard, first_row)
    _check_info(batch, shard, first_row)
    _check_unique(batch.column("rollout_id"), shard, first_row, ids)
    breach = first_breach(batch, vocab_size=vocab_size)
    if breach is not None:
        raise breach_error(shard, first_row, breach, _rollout_id(batch, breach.row))
    if run_ids is not None:
        _check_run_ids(batch, shard, first_row, run_ids)


class ShardCheck:
    """The checks of one shard, batch by batch (check_batch), then the rules that span its rows: one env, task
    and run per group, and no sample index twice in a group (the writer stores whole groups in one shard)."""

    def __init__(self, shard: str, *, vocab_size: int | None = None, run_ids: frozenset[str] | None = None):
        self.shard, self.vocab_size, self.run_ids = shard, vocab_size, run_ids
        self.ids: set[str] = set()
        self._groups: list[pa.RecordBatch] = []

    def batch(self, batch: pa.RecordBatch, first_row: int) -> None:
        check_batch(batch, self.shard, first_row, self.ids, vocab_size=self.vocab_size, run_ids=self.run_ids)
        self._groups.append(batch.select(list(GROUP_COLUMNS)))

    def finish(self) -> None:
        """ShardError naming the first row whose group already holds another env, task or run, or its sample."""
        if not self._groups:
            return
        table, self._groups = pa.Table.from_batches(self._groups), []
        breach = group_breach(table)
        if breach is not None:
            raise breach_error(self.shard, 0, breach, table.column("rollout_id")[breach.row].as_py())


def breach_error(shard: str, first_row: int, breach: Breach, rollout_id: str | None = None) -> ShardError:
    """The ShardError of a row that breaks a rule of the row contract: shard, column, row (in the shard), rule."""
    return _error(shard, breach.column, first_row + breach.row, breach.message(), rollout_id, rule=breach.rule.name)


def _check_run_ids(batch: pa.RecordBatch, shard: str, first_row: int, run_ids: frozenset[str]) -> None:
    """Every row's run_id is one its run's manifest records (a row of another run put in this run's shard would
    be counted, scored and trained as this run's)."""
    column = batch.column("run_id")
    other = [v for v in pc.unique(column).to_pylist() if v not in run_ids]
    if other:
        row = _first_true(pc.is_in(column, value_set=pa.array(other, column.type)))
        recorded = ", ".join(map(repr, sorted(run_ids))) or "none"
        raise _error(shard, "run_id", first_row + row, f"breaks rule run-id-recorded: is the run id its run manifest "
                     f"records ({recorded}) (it holds {shown(column[row].as_py())})", _rollout_id(batch, row),
                     rule="run-id-recorded")


def first_invalid_row(column: pa.Array) -> int:
    """The first row whose value fails full validation (a slice is validated alone; the prefixes that pass tell
    where it starts), or 0 when the array fails as a whole."""
    low, high = 0, len(column)  # the prefix of `low` rows passes; that of `high` rows fails
    while high - low > 1:
        middle = (low + high) // 2
        try:
            column.slice(0, middle).validate(full=True)
            low = middle
        except pa.ArrowException:
            high = middle
    return low


def _first_true(mask: pa.Array) -> int:
    return int(pc.index(mask, True).as_py())


EARLIEST, LATEST = -62135596800 * 10**6, 253402300799 * 10**6  # 0001-01-01 and 9999-12-31, in microseconds


def _check_times(column: pa.Array, shard: str, first_row: int) -> None:
    """Timestamps a Python datetime holds (years 1 to 9999): `to_pylist` raises on any other."""
    bounds = pc.min_max(column)
    low, high = bounds["min"], bounds["max"]
    if not low.is_valid or EARLIEST <= low.value and high.value <= LATEST:
        return
    micros = column.cast(pa.int64())
    outside = pc.fill_null(pc.or_(pc.less(micros, EARLIEST), pc.greater(micros, LATEST)), False)
    raise _error(shard, "created_at", first_row + _first_true(outside), "is not a date between the years 1 and 9999",
                 rule="created-at-range")


def _check_info(batch: pa.RecordBatch, shard: str, first_row: int) -> None:
    """Every `info` decodes as JSON no deeper than MAX_JSON_DEPTH."""
    column = batch.column("info")
    texts = (column.storage if isinstance(column, pa.ExtensionArray) else column).to_pylist()
    limit = MAX_JSON_DEPTH
    try:
        for text in texts:
            value = _DECODE(text)  # msgspec: what parse_json tries first; the rest (NaN, say) is looked at below
            # a text holding fewer brackets than the limit is no deeper than it (len and count run in C)
            if len(text) > limit and text.count("[") + text.count("{") > limit and _depth(value) > limit:
                raise ValueError(f"nested deeper than {limit} levels")
    except (msgspec.DecodeError, RecursionError, TypeError, ValueError):
        _find_bad_info(batch, texts, shard, first_row)


def _find_bad_info(batch: pa.RecordBatch, texts: list, shard: str, first_row: int) -> None:
    for row, text in enumerate(texts):
        try:
            if not isinstance(text, str) or _depth(parse_json(text)) > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        except (ValueError, RecursionError) as exc:  # json's and msgspec's errors (msgspec's are retried by json)
            raise _error(shard, "info", first_row + row, f"is not JSON hubgym reads ({_first_line(exc)})",
                         _rollout_id(batch, row), rule="info-json") from None


def _depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep a decoded JSON value nests (counted up to limit + 1, without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _check_unique(ids: pa.Array, shard: str, first_row: int, seen: set[str]) -> None:
    """No rollout id twice in the shard; its ids join `seen`."""
    values = ids.to_pylist()
    if len(set(values)) == len(values) and seen.isdisjoint(values):
        seen.update(values)
        return
    for row, rollout_id in enumerate(values):
        if rollout_id in seen:
            raise _error(shard, "rollout_id", first_row + row, f"repeats rollout {shown(rollout_id)}: a rollout is "
                         f"stored once, and read twice it would count twice", rule="rollout-id-unique")
        seen.add(rollout_id)


class SeenRollouts:
    """The rollout ids of the shards read so far (about 150 bytes of memory a row: the id and a dict slot): a
    shard holding one of them again is refused, naming both shards."""

    def __init__(self) -> None:
        self.owner: dict[str, str] = {}

    def add(self, shard: str, ids: Iterable[str]) -> None:
        """Record a shard's rollout ids, or raise ShardError naming the first one another shard held (the same shard
        read again, a second pass over a dataset, is no repeat)."""
        ids = list(ids)
        clashes = [] if self.owner.keys().isdisjoint(ids) else [i for i in ids if self.owner.get(i, shard) != shard]
        if clashes:
            clash = min(clashes)  # the same one named whatever the set's order
            raise ShardError(f"shard {shard} repeats rollout {clash!r}, which shard {self.owner[clash]} holds too: a "
                             f"rollout is stored once, and read twice it would count twice; read one of the two "
                             f"runs, or {FIX}", shard=shard)
        self.owner.update(dict.fromkeys(ids, shard))


def as_read(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A stored batch as readers hand it out: today's column types (`upgrade_batch`), none of the file's schema or
    field metadata (what a library reads from it, datasets' `huggingface` features say, is not checked), and each
    reward that is not finite replaced by null with a verifier error naming it, as the rollout loop stores one."""
    batch = upgrade_batch(batch)
    if batch.schema.metadata or any(field.metadata for field in batch.schema):
        schema = pa.schema([field.remove_metadata() for field in batch.schema])
        batch = pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    rewards = batch.column("reward")
    bounds = pc.min_max(rewards)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or -MAX_ABS_REWARD <= low and high <= MAX_ABS_REWARD and math.isfinite(pc.sum(rewards).as_py()):
        return batch  # all null, or all within the bound (min_max skips NaN: the sum does not)
    finite = pc.fill_null(pc.less_equal(pc.abs(rewards), MAX_ABS_REWARD), True)  # NaN compares false
    if pc.all(finite).as_py():
        return batch
    errors = batch.column("error").to_pylist()
    for row in pc.indices_nonzero(pc.invert(finite)).to_pylist():
        value = rewards[row].as_py()
        problem = ("is not a finite number" if not math.isfinite(value) else
                   f"is past +-2^53 ({MAX_ABS_REWARD:.3g}), where a group's sums and squares overflow")
        errors[row] = errors[row] or {"boundary": "verifier", "type": NON_FINITE_REWARD,
                                      "message": f"the stored reward {value!r} {problem}"}
    at = batch.schema.get_field_index
    batch = batch.set_column(at("reward"), batch.schema.field("reward"),
                             pc.if_else(finite, rewards, pa.scalar(None, pa.float64())))
    errors_column = pa.array(errors, ROLLOUT_SCHEMA.field("error").type)
    return batch.set_column(at("error"), batch.schema.field("error"), errors_column)


def _rollout_id(batch: pa.RecordBatch, row: int) -> str | None:
    return batch.column("rollout_id")[row].as_py()


def _error(shard: str, column: str, row: int, problem: str, rollout_id: str | None = None, *,
           rule: str | None = None) -> ShardError:
    which = f"row {row}" + (f" (rollout {shown(rollout_id)})" if rollout_id else "")
    said = problem if problem.startswith("breaks rule") or rule is None else f"{problem} (rule {rule})"
    return ShardError(f"shard {shard}: column {column!r}, {which} {said}; {FIX}", shard=shard, column=column, row=row,
                      rule=rule)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"
