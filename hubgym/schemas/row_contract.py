"""The row contract: what a stored rollout row and group hold, whoever wrote the file, checked in one place.

    breach = first_breach(batch)                   # None, or the first row, column and rule a record batch breaks
    breach = first_breach(batch, vocab_size=1024)  # the token ids also below the vocabulary (a tokenizer is known)
    breach = group_breach(table)                   # one env, task and run per group; no sample index twice
    breach = row_breach(row_dict)                  # a row built in Python (the trainer's sources, an import)
    print(breach.message())                        # "breaks rule token-ids-in-range: holds token ids in [0, 2^31)
                                                   #  only (it holds -5)"
    rules()                                        # (rule, column, what it says) of the whole contract

hubgym's writer (the rollout loop, a re-score, an import) only ever writes rows that keep these rules, and the
trainer relies on each: a token id indexes the model's embedding and output layer; a logprob is the behaviour
policy's log-probability of a sampled token; masks, ids and logprobs are walked together; a group's rows are
the samples of one task. A shard is bytes from someone else (its sha256 says who recorded it, not who wrote
it), so every reader holds what it reads to the contract: hubgym.hub.shard_checks calls `first_breach` and
`group_breach` on every record batch of every shard it opens (report, score, replay, push-rollouts, stats,
view, the trainer's sources), the shard writer calls them on what it writes, and the trainer's row admission
calls `row_breach` on rows that come from elsewhere. Each rule is a few Arrow compute calls over a whole
column; only a breach looks for its row.

`rules()` lists every rule by name with what it says; the checks that keep a file readable at all (valid Arrow,
schema metadata, no null where the writer writes none, `info` JSON, dates Python holds, each rollout id once, the
rows and run id recorded) live in hubgym.hub.shard_checks and hubgym.hub.shards and are named here too
(STRUCTURE_RULES), so every refusal names a rule.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from hubgym.schemas.rollouts import ERROR_BOUNDARIES, ROLLOUT_SCHEMA
from hubgym.schemas.tasks import ENV_NAME, ENV_NAME_RULE, KINDS

MAX_TOKEN_ID = 2**31 - 1  # int32: what the schema stores and torch's embedding takes
MAX_ABS_REWARD = 2.0**53
"""The largest reward magnitude a reader takes as a reward (2^53: where a float64 still holds every integer). A
group's rewards are summed and squared for its advantages; far past this they overflow to infinity and the
advantages become NaN. Past it a stored reward is treated as a non-finite one: no reward, a verifier error."""


@dataclass(frozen=True)
class Rule:
    """One invariant of a stored row: its name (stable: messages, docs and tests cite it), the column a breach is
    reported in, what it says, the columns it reads, and the check (True per row that breaks it)."""

    name: str
    column: str
    says: str
    needs: tuple[str, ...]
    breaks: Callable[[pa.RecordBatch], pa.Array]
    shows: Callable[[pa.RecordBatch, int], Any] | None = None  # what the breaking row holds; else the cell
    keeps: Callable[[dict[str, Any]], bool] | None = None  # the same rule on one row dict (its values in Python)


@dataclass(frozen=True)
class Breach:
    """Where a batch breaks a rule: its row (within the batch), the rule, and the value that breaks it."""

    row: int
    rule: Rule
    value: Any

    @property
    def column(self) -> str:
        return self.rule.column

    def message(self) -> str:
        """'breaks rule NAME: what it says (it holds VALUE)': the end of a sentence that names the row and column."""
        return f"breaks rule {self.rule.name}: {self.rule.says} (it holds {shown(self.value)})"


class Said(str):
    """What a breaking row holds, already in words (its stored parts quoted with `shown`): shown as it is."""


def shown(value: Any, limit: int = 80) -> str:
    """A stored value as a message shows it: its repr (control characters escaped), cut to `limit` characters."""
    if isinstance(value, Said):
        return str(value)
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# -- building blocks: one boolean per row, null counted as not breaking -------------------------------------------
# Scalars are made once, of the column's type: an untyped Python number costs Arrow a cast on every call.


@functools.lru_cache(maxsize=None)
def _scalar(value: Any, type_: pa.DataType) -> pa.Scalar:
    return pa.scalar(value, type_)


@functools.lru_cache(maxsize=64)
def _none(n: int) -> pa.Array:
    """n times False (batches mostly share a few sizes: made once each)."""
    return pa.array([False] * n, pa.bool_())


class _Batch:
    """A record batch as the rules read it: its columns, and each list column's lengths computed once (several
    rules compare them)."""

    def __init__(self, batch: pa.RecordBatch):
        self.batch, self.num_rows, self.schema = batch, batch.num_rows, batch.schema
        self._lengths: dict[str, pa.Array] = {}

    def column(self, name: str) -> pa.Array:
        return self.batch.column(name)

    def lengths(self, name: str) -> pa.Array:
        if name not in self._lengths:
            self._lengths[name] = _false_on_null(pc.list_value_length(self.batch.column(name)), 0)
        return self._lengths[name]


def _rows_with(column: pa.Array, bad_values: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """Per row of a list column: whether any of its values is bad."""
    flat = pc.list_flatten(column)
    if len(flat) == 0:
        return _none(len(column))
    bad = bad_values(flat)
    if not pc.any(bad).as_py():  # any() skips nulls: a null value breaks nothing
        return _none(len(column))
    rows = pc.filter(pc.list_parent_indices(column), _false_on_null(bad))
    return pc.is_in(pa.array(range(len(column)), rows.type), value_set=rows)


def _first_item(column: str, bad_values: Callable[[pa.Array], pa.Array]) -> Callable[[pa.RecordBatch, int], Any]:
    """The first bad value of a list cell, for the message."""
    def first(batch: pa.RecordBatch, row: int) -> Any:
        flat = pc.list_flatten(batch.column(column).slice(row, 1))
        return pc.filter(flat, _false_on_null(bad_values(flat)))[0].as_py()
    return first


def _strings_not(column: pa.Array, ok: Callable[[str], bool]) -> pa.Array:
    """Per row of a string column: whether its value fails `ok` (tested once per distinct value, in Python: the
    columns it is used on hold a few distinct values a batch)."""
    bad = [v for v in pc.unique(column).to_pylist() if v is not None and not ok(v)]
    return pc.is_in(column, value_set=pa.array(bad, column.type)) if bad else _none(len(column))


def _lengths(batch: _Batch, column: str) -> pa.Array:
    return batch.lengths(column)


def _field(batch: pa.RecordBatch, column: str, name: str) -> pa.Array:
    """A struct column's field, null where the struct is (pc.struct_field keeps the parent's nulls)."""
    return pc.struct_field(batch.column(column), name)


def _false_on_null(values: pa.Array, fill: Any = False) -> pa.Array:
    """Nulls replaced by `fill` (False: a null breaks no rule); an array without nulls as it is (most are)."""
    return values if values.null_count == 0 else pc.coalesce(values, _scalar(fill, values.type))


def _lengths_shown(column: str) -> Callable[[pa.RecordBatch, int], Any]:
    def lengths(batch: pa.RecordBatch, row: int) -> str:
        return Said(f"{len(batch.column(column)[row].as_py() or [])} value(s) for "
                    f"{len(batch.column('completion_ids')[row].as_py() or [])} token(s)")
    return lengths


def _negative(values: pa.Array) -> pa.Array:
    return pc.less(values, _scalar(0, values.type))


def _below_one(values: pa.Array) -> pa.Array:
    return pc.less(values, _scalar(1, values.type))


def _not_a_logprob(values: pa.Array) -> pa.Array:
    return pc.or_(pc.invert(pc.is_finite(values)), pc.greater(values, _scalar(0.0, values.type)))


def _not_a_duration(values: pa.Array) -> pa.Array:
    return pc.or_(pc.invert(pc.is_finite(values)), _negative(values))


def _not_a_mask_value(values: pa.Array) -> pa.Array:
    return pc.or_(_negative(values), pc.greater(values, _scalar(1, values.type)))


def _empty(batch: pa.RecordBatch, column: str) -> pa.Array:
    return pc.equal(_lengths(batch, column), _scalar(0, pa.int32()))


def _none_or(value: Any, ok: Callable[[Any], bool]) -> bool:
    """A null keeps a row rule (the not-null rule is the structure's: shard_checks)."""
    return value is None or ok(value)


def _at_least(low: int) -> Callable[[Any], bool]:
    return lambda value: value >= low


def _ids_ok(ids: Any, top: int) -> bool:
    """Every id an int in [0, top): min and max run in C; the type walk only when they pass."""
    return not ids or (min(ids) >= 0 and max(ids) < top and all(type(i) is int for i in ids))


def _empty_name(column: str) -> Rule:
    return Rule("name-set", column, "is not empty (the writer always names a row's ids)", (column,),
                lambda b: _false_on_null(pc.equal(pc.binary_length(b.column(column)), _scalar(0, pa.int32()))),
                keeps=lambda r: r[column] != "")


def _ids_in_range(column: str) -> Rule:
    return Rule("token-ids-in-range", column, "holds token ids in [0, 2^31) only", (column,),
                lambda b: _rows_with(b.column(column), _negative), _first_item(column, _negative),
                lambda r: _ids_ok(r[column], MAX_TOKEN_ID + 1))


def _metrics_break(batch: pa.RecordBatch) -> pa.Array:
    return _rows_with(batch.column("metrics"), lambda flat: pc.invert(pc.is_finite(pc.struct_field(flat, "value"))))


def _timings_break(batch: pa.RecordBatch) -> pa.Array:
    timings = batch.column("timings")
    fields = [pc.struct_field(timings, i) for i in range(timings.type.num_fields)]
    if all(pc.all(pc.is_finite(f)).as_py() and not pc.any(_negative(f)).as_py() for f in fields):
        return _none(len(timings))  # the common case: four aggregate calls a field, no mask built
    out = _none(len(timings))
    for values in fields:
        out = pc.or_(out, _false_on_null(_not_a_duration(values)))
    return out


def _interaction(name: str) -> Callable[[pa.RecordBatch], pa.Array]:
    return lambda b: _field(b, "interaction", name)


def _cell(column: str, name: str) -> Callable[[pa.RecordBatch, int], Any]:
    return lambda b, row: (b.column(column)[row].as_py() or {}).get(name)


_ENV = re.compile(rf"{ENV_NAME.pattern}(?:-v[1-9][0-9]{{0,8}})?")
"""An env name, or a versioned env id (`arithmetic-v2`): what a stored row's env may be (envs.stored reads both)."""


def _env_name(value: str) -> bool:
    return _ENV.fullmatch(value) is not None


ROW_RULES: tuple[Rule, ...] = (
    *(_empty_name(c) for c in ("rollout_id", "run_id", "task_id", "group")),
    Rule("env-name", "env", f"is an env name ({ENV_NAME_RULE}), or one with its version (-v<N>)", ("env",),
         lambda b: _strings_not(b.column("env"), _env_name), keeps=lambda r: _none_or(r["env"], _env_name)),
    Rule("sample-index", "sample", "is a sample index >= 0", ("sample",),
         lambda b: _false_on_null(_negative(b.column("sample"))), keeps=lambda r: _none_or(r["sample"], _at_least(0))),
    _ids_in_range("prompt_ids"),
    _ids_in_range("completion_ids"),
    Rule("prompt-for-tokens", "prompt_ids", "is not empty when completion_ids is not (sampled tokens follow a "
         "prompt's)", ("prompt_ids", "completion_ids"),
         lambda b: pc.and_(_empty(b, "prompt_ids"), pc.invert(_empty(b, "completion_ids"))),
         lambda b, row: Said(f"no prompt ids for {len(b.column('completion_ids')[row].as_py())} completion token(s)"),
         lambda r: bool(r["prompt_ids"]) or not r["completion_ids"]),
    Rule("completion-for-tokens", "completion", "holds the messages its completion_ids encode (not empty when they "
         "are not)", ("completion", "completion_ids"),
         lambda b: pc.and_(_empty(b, "completion"), pc.invert(_empty(b, "completion_ids"))),
         lambda b, row: Said(f"no message for {len(b.column('completion_ids')[row].as_py())} completion token(s)"),
         lambda r: bool(r["completion"]) or not r["completion_ids"]),
    Rule("one-mask-per-token", "completion_mask", "holds one value per completion token (completion_ids)",
         ("completion_mask", "completion_ids"),
         lambda b: pc.not_equal(_lengths(b, "completion_mask"), _lengths(b, "completion_ids")),
         _lengths_shown("completion_mask"),
         lambda r: len(r["completion_mask"] or ()) == len(r["completion_ids"] or ())),
    Rule("mask-values", "completion_mask", "holds only 0 (an env or tool token) and 1 (a sampled token)",
         ("completion_mask",), lambda b: _rows_with(b.column("completion_mask"), _not_a_mask_value),
         _first_item("completion_mask", _not_a_mask_value),
         lambda r: all(m is None or m in (0, 1) for m in r["completion_mask"] or ())),
    Rule("one-logprob-per-token", "completion_logprobs", "holds one logprob per completion token, or none (not "
         "recorded)", ("completion_logprobs", "completion_ids"),
         lambda b: pc.and_(pc.invert(_empty(b, "completion_logprobs")),
                           pc.not_equal(_lengths(b, "completion_logprobs"), _lengths(b, "completion_ids"))),
         _lengths_shown("completion_logprobs"),
         lambda r: len(r["completion_logprobs"] or ()) in (0, len(r["completion_ids"] or ()))),
    Rule("logprobs-finite", "completion_logprobs", "holds finite logprobs <= 0 (a probability is at most 1)",
         ("completion_logprobs",), lambda b: _rows_with(b.column("completion_logprobs"), _not_a_logprob),
         _first_item("completion_logprobs", _not_a_logprob),
         lambda r: all(x is None or -math.inf < x <= 0.0 for x in r["completion_logprobs"] or ())),
    Rule("count-nonnegative", "num_turns", "is a count >= 0", ("num_turns",),
         lambda b: _false_on_null(_negative(b.column("num_turns"))),
         keeps=lambda r: _none_or(r["num_turns"], _at_least(0))),
    Rule("interaction-kind", "interaction", f"has a kind hubgym runs ({', '.join(KINDS)})", ("interaction",),
         lambda b: _strings_not(_false_on_null(_interaction("kind")(b), ""), KINDS.__contains__),
         _cell("interaction", "kind"), lambda r: (r["interaction"] or {}).get("kind") in KINDS),
    Rule("interaction-turns", "interaction", "allows max_turns >= 1", ("interaction",),
         lambda b: _false_on_null(_below_one(_interaction("max_turns")(b))), _cell("interaction", "max_turns"),
         lambda r: _none_or((r["interaction"] or {}).get("max_turns"), _at_least(1))),
    Rule("reward-or-error", "reward", "is set exactly when the row has no error (a failed row has no reward, and a "
         "row without one says why in `error`)", ("reward", "error"),
         lambda b: pc.equal(pc.is_valid(b.column("reward")), pc.is_valid(b.column("error"))),
         lambda b, row: {"reward": b.column("reward")[row].as_py(), "error": b.column("error")[row].as_py()},
         lambda r: (r["reward"] is None) != (r["error"] is None)),
    Rule("error-boundary", "error", f"names the boundary that failed ({', '.join(ERROR_BOUNDARIES)})", ("error",),
         lambda b: pc.and_(pc.is_valid(b.column("error")),
                           _strings_not(_false_on_null(_field(b, "error", "boundary"), ""),
                                        ERROR_BOUNDARIES.__contains__)),
         _cell("error", "boundary"), lambda r: r["error"] is None or r["error"].get("boundary") in ERROR_BOUNDARIES),
    Rule("metrics-finite", "metrics", "holds finite values", ("metrics",), _metrics_break,
         lambda b, row: [m for m in b.column("metrics")[row].as_py() if not _finite(m.get("value"))][0],
         lambda r: all(_finite((m or {}).get("value")) for m in r["metrics"] or ())),
    Rule("timings-nonnegative", "timings", "holds finite durations >= 0 (or none)", ("timings",), _timings_break,
         lambda b, row: b.column("timings")[row].as_py(),
         lambda r: all(x is None or 0.0 <= x < math.inf for x in (r["timings"] or {}).values())),
    Rule("policy-version", "provenance", "has a policy_version >= 0", ("provenance",),
         lambda b: _false_on_null(_negative(_field(b, "provenance", "policy_version"))),
         _cell("provenance", "policy_version"),
         lambda r: _none_or((r["provenance"] or {}).get("policy_version"), _at_least(0))),
)
"""Every rule a single row keeps, in the order a row is checked (the first it breaks is the one reported)."""


def _finite(value: Any) -> bool:
    """Null, or a finite number (a metric's value)."""
    return value is None or isinstance(value, (int, float)) and math.isfinite(value)


def vocabulary_rules(vocab_size: int) -> tuple[Rule, ...]:
    """The token ids below `vocab_size`: held where a tokenizer or model is at hand (view --tokenizer, replay
    --model, train), since an id past it indexes nothing in the embedding and output layer."""
    def past(values: pa.Array) -> pa.Array:
        return pc.greater_equal(values, _scalar(vocab_size, values.type))

    says = f"holds token ids below the vocabulary size of the tokenizer in use ({vocab_size})"
    return tuple(Rule("token-ids-in-vocabulary", c, says, (c,), lambda b, c=c: _rows_with(b.column(c), past),
                      _first_item(c, past), lambda r, c=c: _ids_ok(r[c], vocab_size))
                 for c in ("prompt_ids", "completion_ids"))


def first_breach(batch: pa.RecordBatch, *, vocab_size: int | None = None) -> Breach | None:
    """The first row of `batch` (then the first rule, in ROW_RULES order) that breaks a row rule, or None. Rules
    whose columns the batch lacks are not checked (the trainer's sources read fewer columns)."""
    rules = ROW_RULES + (vocabulary_rules(vocab_size) if vocab_size is not None else ())
    names = set(batch.schema.names)
    batch = _Batch(batch)
    found: tuple[int, int] | None = None  # (row, rule index)
    for i, rule in enumerate(rules):
        if not names.issuperset(rule.needs):
            continue
        mask = rule.breaks(batch)
        if not pc.any(mask).as_py():
            continue
        row = pc.index(mask, True).as_py()
        if found is None or row < found[0]:
            found = (row, i)
    if found is None:
        return None
    row, rule = found[0], rules[found[1]]
    value = rule.shows(batch, row) if rule.shows else batch.column(rule.column)[row].as_py()
    return Breach(row, rule, value)


# -- groups -----------------------------------------------------------------------------------------------------

GROUP_COLUMNS = ("rollout_id", "group", "env", "task_id", "run_id", "sample")
"""What the group rules read: a shard keeps these of each batch for its check (a shard holds whole groups)."""
GROUP_RULES: tuple[Rule, ...] = tuple(
    Rule("group-one-task", column, "is the same for every row of a group (a group is the samples of one task of one "
         "run)", ("group", column), lambda b: _none(b.num_rows)) for column in ("env", "task_id", "run_id")) + (
    Rule("group-distinct-samples", "sample", "differs between the rows of a group (each sample is stored once)",
         ("group", "sample"), lambda b: _none(b.num_rows)),
)


def group_breach(table: pa.Table) -> Breach | None:
    """The first row (in table order) whose group already holds another env, task or run, or the same sample index;
    None when every group keeps the rules. The writer stores whole groups in one shard, so a shard's rows are a
    whole read for this check."""
    if table.num_rows == 0:
        return None
    counts = table.group_by("group").aggregate([(c, "count_distinct") for c in ("env", "task_id", "run_id")]
                                               + [("sample", "count_distinct"), ("sample", "count")])
    odd = pc.or_(pc.or_(pc.greater(counts["env_count_distinct"], 1), pc.greater(counts["task_id_count_distinct"], 1)),
                 pc.or_(pc.greater(counts["run_id_count_distinct"], 1),
                        pc.less(counts["sample_count_distinct"], counts["sample_count"])))
    if not pc.any(odd).as_py():
        return None
    return _first_in_python(table, set(pc.filter(counts["group"], odd).to_pylist()))


def _first_in_python(table: pa.Table, groups: set[str]) -> Breach | None:
    """The breaking row of the groups found odd, walked in table order (only those groups' rows)."""
    first: dict[str, dict[str, Any]] = {}
    samples: dict[str, set] = {}
    rows = table.select(list(GROUP_COLUMNS)).to_pylist()
    for row_number, row in enumerate(rows):
        key = row["group"]
        if key not in groups:
            continue
        if key not in first:
            first[key], samples[key] = row, {row["sample"]}
            continue
        for rule in GROUP_RULES[:3]:
            if row[rule.column] != first[key][rule.column]:
                held = f"{shown(row[rule.column])} in group {shown(key)}, whose first row holds"
                return Breach(row_number, rule, Said(f"{held} {shown(first[key][rule.column])}"))
        if row["sample"] in samples[key]:
            return Breach(row_number, GROUP_RULES[3], Said(f"sample {row['sample']} twice in group {shown(key)}"))
        samples[key].add(row["sample"])
    return None


# -- rows built in Python -----------------------------------------------------------------------------------------


def row_breach(row: dict[str, Any], *, vocab_size: int | None = None) -> Breach | None:
    """The first rule a row dict breaks, or None: the same rules as `first_breach`, each one's `keeps` run on the
    row's Python values (a row costs microseconds, not a record batch's fixed cost; tests hold the two to the same
    verdicts). Rules whose columns the row lacks are not checked (a trainer's source may read fewer). A value of
    another type than its column's (a string for a count) breaks rule column-type."""
    for rule in ROW_RULES + (vocabulary_rules(vocab_size) if vocab_size is not None else ()):
        if not all(c in row for c in rule.needs):
            continue
        try:
            kept = rule.keeps(row)
        except (TypeError, ValueError, AttributeError):
            return Breach(0, _type_rule(rule.column), row[rule.column])
        if not kept:
            return Breach(0, rule, row[rule.column])
    return None


def _type_rule(column: str) -> Rule:
    field = ROLLOUT_SCHEMA.field(column)
    return Rule("column-type", column, f"holds a value of its type in the rollout schema ({field.type})", (column,),
                lambda b: _none(b.num_rows))


def vocabulary_breach(row: dict[str, Any], vocab_size: int) -> Breach | None:
    """The vocabulary rule alone, on a row already read (a reader that learns the tokenizer after its first rows:
    `hubgym replay --model`)."""
    for rule in vocabulary_rules(vocab_size):
        if rule.column in row and not rule.keeps(row):
            return Breach(0, rule, next((i for i in row[rule.column] if i >= vocab_size), row[rule.column]))
    return None


def group_mismatch(first: dict[str, Any], row: dict[str, Any]) -> Rule | None:
    """The group rule `row` breaks by joining the group whose first row is `first` (another env, task or run), or
    None; a sample index twice is the caller's to see (it holds the group's rows)."""
    return next((rule for rule in GROUP_RULES[:3] if row.get(rule.column) != first.get(rule.column)), None)


# -- the contract as a whole, for docs and messages ---------------------------------------------------------------

STRUCTURE_RULES: tuple[tuple[str, str], ...] = (
    ("valid-arrow", "every column passes Arrow's full validation (offsets, UTF-8, child lengths)"),
    ("rollout-schema", "every rollout column is there, with the rollout schema's type"),
    ("schema-metadata", "the schema's metadata (datasets' features, extension names) is UTF-8 text"),
    ("not-null", "no null where the writer writes none (ids, messages, token record, provenance, ...)"),
    ("info-json", "`info` is JSON, nested at most 64 deep"),
    ("created-at-range", "created_at is a date between the years 1 and 9999"),
    ("rollout-id-unique", "a rollout id is stored once, in one shard"),
    ("rows-recorded", "a shard holds the rows (and sha256) its run manifest or index.json records"),
    ("run-id-recorded", "every row's run_id is the one its run manifest records"),
)
"""The rules that keep a shard readable at all (hubgym.hub.shard_checks), by name."""


def rules() -> list[tuple[str, str, str]]:
    """(rule, column, what it says) for every rule of the contract, structure first: the documented contract."""
    out = [(name, "*", says) for name, says in STRUCTURE_RULES]
    seen: set[tuple[str, str]] = set()
    for rule in (*ROW_RULES, *vocabulary_rules(0), *GROUP_RULES):
        if (rule.name, rule.column) not in seen:
            seen.add((rule.name, rule.column))
            out.append((rule.name, rule.column, rule.says.replace(" (0)", "")))
    return out
