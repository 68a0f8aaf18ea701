"""Which stored rollouts to learn from: a Selection, planned in one light pass over the sources.

    plan = plan_selection(["runs/r1", "org/rollouts@3f1c2e9"], Selection(min_reward=1.0, best_of_group=1))
    plan.kept                        # the rollout ids selected, in source order
    plan.counts                      # rows read, kept, and dropped under each rule
    plan.row(row)                    # a row as the plan sees it: re-scored values where it re-scored
    console.print(plan.table())

The trainer's offline phase (train config `offline.select`) and `hubgym export sft` both learn from
a plan: a first pass reads only the columns the rules need (ids, group, reward, provenance, the
completion's token ids for duplicates) and, with a VerifierChoice, re-scores each record batch with
the verifiers chosen (as `hubgym score` does, without writing anything); the second pass, the
training stream or the export, keeps the planned rows. So what is kept is known, reported and
checked (a selection that keeps nothing is one error naming it) before anything trains.

Each row is dropped under the first rule it breaks, in this order:
    unusable        a failed or unscored row (after re-scoring, when asked)
    env / model / policy_version     `envs` (ENV, or ENV:CONFIG by the config's task ids), `models`
                    (globs of the sampler), `policy_versions` (an inclusive range)
    varied_groups   a group whose usable rows all scored the same
    best_of_group   rows below the k best of their group (higher reward first, then lower sample)
    min_reward / success   a reward below the bound; not a success by its verifier (metric `success`)
    duplicate       the same task and completion tokens as a row kept before it
    limit           rows after the first `limit` kept
Group rules see a group's rows that passed the rules before them: a group of the stored rollouts is
judged by its rows, whatever order the shards hold them in.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hubgym.errors import SelectionError

RULES = ("unusable", "env", "model", "policy_version", "varied_groups", "best_of_group", "min_reward", "success",
         "duplicate", "limit")
FACT_COLUMNS = ("rollout_id", "group", "sample", "env", "task_id", "reward", "error", "metrics", "provenance")


class Selection(BaseModel):
    """Which stored rows train (or are exported); every rule is off by default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    min_reward: float | None = Field(None, description="keep rows whose reward is at least this")
    success: bool = Field(False, description="keep only rows their verifier counts a success (metric `success`)")
    varied_groups: bool = Field(False, description="keep only groups whose rewards differ (GRPO's signal)")
    best_of_group: int | None = Field(None, ge=1, description="keep the k best rows of each group (reward, then "
                                      "lower sample): best-of-k")
    envs: list[str] = Field(default_factory=list, description="keep rows of these envs: ENV, or ENV:CONFIG (rows "
                            "whose task is one of that config's); empty = every env")
    models: list[str] = Field(default_factory=list, description="keep rows sampled by these models (globs of "
                              "provenance.model, e.g. '*SmolLM2*'); empty = any")
    policy_versions: tuple[int, int] | None = Field(None, description="(low, high): keep rows sampled at these "
                                                    "policy versions, both included")
    limit: int = Field(0, ge=0, description="keep at most this many rows, the first in source order (0 = all)")
    dedupe: bool = Field(False, description="keep a row with the same task and completion tokens as a kept one "
                         "only once (off by default: under GRPO, equal samples of a group are its distribution)")

    @field_validator("policy_versions")
    @classmethod
    def _ordered(cls, versions: tuple[int, int] | None) -> tuple[int, int] | None:
        if versions is not None and versions[0] > versions[1]:
            raise ValueError(f"policy_versions=({versions[0]}, {versions[1]}) must be (low, high) with low <= high")
        return versions

    def describe(self) -> str:
        """The rules that are on, as a user would set them: 'min_reward=1, best_of_group=2'."""
        on = {k: v for k, v in self.model_dump().items() if v not in (None, False, [], 0)}
        return ", ".join(f"{k}={_shown(v)}" for k, v in on.items()) or "no rules (every usable row)"


def selection_from_sets(sets: list[str]) -> Selection:
    """A Selection from `key=value` items (YAML values: `min_reward=1`, `envs=[arithmetic:sums]`), as `hubgym export
    sft --set` gives them; an unknown key names the closest one, a bad value its rule."""
    import difflib

    import yaml
    from pydantic import ValidationError

    values: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        key = key.strip().removeprefix("select.")
        if not sep or key not in Selection.model_fields:
            close = difflib.get_close_matches(key, list(Selection.model_fields), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SelectionError(f"--set {item!r}: {'write key=value' if not sep else f'no selection rule {key!r}'}; "
                                 f"{hint}rules: {', '.join(Selection.model_fields)}")
        values[key] = yaml.safe_load(raw)
    try:
        return Selection(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}={e.get('input')!r}: "
                             f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise SelectionError(f"invalid selection: {problems}") from None


@dataclass
class Facts:
    """What the rules read of one stored row."""

    rollout_id: str
    group: str
    sample: int
    reward: float
    success: bool
    digest: bytes  # of (task_id, completion_ids): duplicates
    has_logprobs: bool  # one behaviour logprob per completion token
    env: str


@dataclass
class SelectionPlan:
    """The outcome of a first pass: which rows are kept, why the others went, and re-scored values."""

    selection: Selection
    sources: list[str]
    kept: list[str] = field(default_factory=list)  # rollout ids, in source order
    counts: Counter = field(default_factory=Counter)  # read, kept, dropped/<rule>
    rescored: dict[str, tuple[float | None, list, dict | None]] = field(default_factory=dict)  # id -> new values
    changed: int = 0  # re-scored rows whose reward differs from the stored one
    without_logprobs: list[tuple[str, str]] = field(default_factory=list)  # kept rows lacking them: (env, id)
    groups: set[str] = field(default_factory=set)  # group keys with a kept row

    def __post_init__(self) -> None:
        self._kept = set(self.kept)

    def keeps(self, rollout_id: str) -> bool:
        return rollout_id in self._kept

    def row(self, row: dict[str, Any]) -> dict[str, Any]:
        """`row` with its re-scored reward, metrics and error where the plan re-scored it (in place)."""
        new = self.rescored.get(row.get("rollout_id"))
        if new is not None:
            row["reward"], row["metrics"], row["error"] = new
        return row

    def metrics(self) -> dict[str, float]:
        """The plan's counts as training metrics (`offline/select/...`, `offline/rescore/changed_rows`)."""
        out = {f"offline/select/{key}": float(value) for key, value in sorted(self.counts.items())}
        if self.rescored:
            out["offline/rescore/changed_rows"] = float(self.changed)
        return out

    def table(self, title: str = "offline selection"):
        from rich.table import Table

        heading = f"{title}: {self.selection.describe()}"
        table = Table("rows", "count", title=heading, box=None, min_width=len(heading))  # the rules on one line
        table.add_row("read", str(self.counts["read"]))
        for rule in RULES:
            if self.counts[f"dropped/{rule}"]:
                table.add_row(f"dropped: {rule}", str(self.counts[f"dropped/{rule}"]))
        table.add_row("kept", str(self.counts["kept"]), style="bold")
        if self.rescored:
            table.add_row("re-scored, reward changed", str(self.changed))
        return table

    def check_not_empty(self) -> None:
        """A selection that keeps nothing is an error naming it and where the rows went."""
        if self.kept:
            return
        went = ", ".join(f"{self.counts[f'dropped/{r}']} by {r}" for r in RULES if self.counts[f"dropped/{r}"])
        raise SelectionError(f"the selection ({self.selection.describe()}) keeps none of the {self.counts['read']} "
                             f"rows of {', '.join(self.sources)} (dropped: {went or 'none read'}); loosen it, or "
                             f"give sources that hold such rows")


def plan_selection(sources: list[str], selection: Selection, *, hub=None, choice=None, trust: bool = False,
                   pins: dict[str, str] | None = None) -> SelectionPlan:
    """Read the sources once (light columns; the scored ones too with a VerifierChoice `choice`, which re-scores
    each batch) and decide which rows the selection keeps."""
    from hubgym.hub.rollout_reader import iter_batches

    plan = SelectionPlan(selection, list(sources))
    rules = _RowRules(selection, _config_tasks(selection.envs, hub, trust, pins))
    facts: list[Facts] = []
    for source in sources:
        for batch in iter_batches(source, hub=hub):
            facts += _batch_facts(batch, rules, plan, choice)
    _decide(facts, selection, plan)
    plan.__post_init__()
    return plan


class _RowRules:
    """The rules a row passes or breaks on its own (env, model, policy version)."""

    def __init__(self, selection: Selection, config_tasks: dict[str, set[str]]):
        self.selection, self.config_tasks = selection, config_tasks

    def broken(self, env: str, task_id: str, provenance: dict | None) -> str | None:
        s, provenance = self.selection, provenance or {}
        if s.envs and not any(_env_matches(ref, env, task_id, self.config_tasks) for ref in s.envs):
            return "env"
        model = str(provenance.get("model") or "")
        if s.models and not any(fnmatch.fnmatchcase(model, pattern) for pattern in s.models):
            return "model"
        version = provenance.get("policy_version") or 0
        if s.policy_versions is not None and not s.policy_versions[0] <= version <= s.policy_versions[1]:
            return "policy_version"
        return None


def _batch_facts(batch: pa.RecordBatch, rules: _RowRules, plan: SelectionPlan, choice) -> list[Facts]:
    """The facts of a record batch's rows that pass the row rules (re-scored first when `choice` is given)."""
    columns = {name: batch.column(name).to_pylist() for name in FACT_COLUMNS}
    passed = []
    for i in range(batch.num_rows):
        plan.counts["read"] += 1
        rule = rules.broken(columns["env"][i], columns["task_id"][i], columns["provenance"][i])
        if rule is not None:
            plan.counts[f"dropped/{rule}"] += 1
        else:
            passed.append(i)
    if not passed:
        return []
    if choice is not None:
        _rescore(batch.take(pa.array(passed, pa.int64())), [columns["rollout_id"][i] for i in passed], plan, choice)
    ids, lengths = _completion_ids(batch)
    logprob_lengths = batch.column("completion_logprobs").value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    out = []
    for i in passed:
        rollout_id = columns["rollout_id"][i]
        reward, metrics, error = plan.rescored.get(rollout_id) or (columns["reward"][i], columns["metrics"][i],
                                                                   columns["error"][i])
        if error is not None or reward is None or not math.isfinite(reward) or not lengths[i]:
            plan.counts["dropped/unusable"] += 1
            continue
        digest = hashlib.blake2b(columns["task_id"][i].encode() + b"\0" + ids[i], digest_size=16).digest()
        success = any(m["name"] == "success" and m["value"] >= 1 for m in metrics or [])
        out.append(Facts(rollout_id, columns["group"][i] or rollout_id, columns["sample"][i] or 0, float(reward),
                         success, digest, int(logprob_lengths[i]) == int(lengths[i]), columns["env"][i]))
    return out


def _completion_ids(batch: pa.RecordBatch) -> tuple[list[bytes], list[int]]:
    """Each row's completion token ids as bytes (to hash) and their count, from the column's flat buffer."""
    column = batch.column("completion_ids")
    lengths = column.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).tolist()
    values = column.flatten().to_numpy(zero_copy_only=False).astype("<i4")
    out, at = [], 0
    for length in lengths:
        out.append(values[at:at + length].tobytes())
        at += length
    return out, lengths


def _rescore(batch: pa.RecordBatch, ids: list[str], plan: SelectionPlan, choice) -> None:
    """Score `batch` with the chosen verifiers (as `hubgym score` does) and record each row's new values."""
    from hubgym.score.scoring import score_batch, slim

    envs = sorted(set(batch.column("env").to_pylist()))
    new = score_batch({env: choice.spec(env) for env in envs}, slim(batch))
    old = batch.column("reward").to_pylist()
    for rollout_id, before, reward, metrics, error in zip(ids, old, new.column("rescore_reward").to_pylist(),
                                                           new.column("rescore_metrics").to_pylist(),
                                                           new.column("rescore_error").to_pylist()):
        plan.rescored[rollout_id] = (reward, metrics, error)
        plan.changed += not _same(before, reward)


def _decide(facts: list[Facts], selection: Selection, plan: SelectionPlan) -> None:
    """The group, reward, duplicate and limit rules over the rows that passed the row rules."""
    by_group: dict[str, list[Facts]] = defaultdict(list)
    for fact in facts:
        by_group[fact.group].append(fact)
    dropped: dict[str, str] = {}
    for rows in by_group.values():
        if selection.varied_groups and max(r.reward for r in rows) - min(r.reward for r in rows) < 1e-9:
            dropped.update({r.rollout_id: "varied_groups" for r in rows})
            continue
        if selection.best_of_group is not None:
            ranked = sorted(rows, key=lambda r: (-r.reward, r.sample))
            dropped.update({r.rollout_id: "best_of_group" for r in ranked[selection.best_of_group:]})
    seen: set[bytes] = set()
    for fact in facts:
        rule = dropped.get(fact.rollout_id) or _reward_rule(fact, selection)
        if rule is None and selection.dedupe and fact.digest in seen:
            rule = "duplicate"
        if rule is None and selection.limit and len(plan.kept) >= selection.limit:
            rule = "limit"
        if rule is not None:
            plan.counts[f"dropped/{rule}"] += 1
            continue
        seen.add(fact.digest)
        plan.kept.append(fact.rollout_id)
        plan.groups.add(fact.group)
        if not fact.has_logprobs:
            plan.without_logprobs.append((fact.env, fact.rollout_id))
    plan.counts["kept"] = len(plan.kept)


def _reward_rule(fact: Facts, selection: Selection) -> str | None:
    if selection.min_reward is not None and fact.reward < selection.min_reward:
        return "min_reward"
    if selection.success and not fact.success:
        return "success"
    return None


def _env_matches(ref: str, env: str, task_id: str, config_tasks: dict[str, set[str]]) -> bool:
    name, _, config = ref.partition(":")
    if not config:
        return env == name
    return task_id in config_tasks[ref]


def _config_tasks(refs: Iterable[str], hub, trust: bool, pins: dict[str, str] | None) -> dict[str, set[str]]:
    """The task ids of each ENV:CONFIG selection, every split (built, or read from a hub env)."""
    from hubgym.envs import open_env

    out = {}
    for ref in refs:
        if ":" not in ref:
            continue
        opened = open_env(ref, hub=hub, trust=trust, pins=pins)
        tasks = opened.dataset(None)
        out[ref] = {task_id for split in tasks.values() for task_id in split["id"]}
    return out


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)
