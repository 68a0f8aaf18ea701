"""The named conformance checks, in the order they run (`CHECKS`).

Each check is a small function of the shared Context (hubgym.conformance.context) that returns
None or raises EnvContractError: what went wrong and its most likely cause, where (env, config,
split, row id, field), and how to fix it. Checks never `assert` (asserts vanish under
`python -O`). Checks that do not apply to an env (reset/step checks of a single_turn env) pass.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from typing import TYPE_CHECKING, Any, Callable

import datasets

from hubgym.builders.clock import CHECK_CLOCKS
from hubgym.conformance.common import (CLOCK_FIX, SCORE_CLOCK_FIX, SEEDED_FIX, TOL, CheckSkipped, Sample, fail,
                                      guarded, same_score, score_summary, short)
from hubgym.conformance.batches import check_batch_rows_independent
from hubgym.conformance.episodes import check_golden_replay, check_reset_step_deterministic
from hubgym.conformance.process import (check_scoring_independent_of_environment,
                                        check_scoring_independent_of_hash_seed,
                                        check_scoring_leaves_global_random_alone,
                                        check_scoring_stable_over_many_calls)
from hubgym.conformance.splits import check_held_out_apart
from hubgym.conformance.tools import check_tool_schemas, check_tools_run
from hubgym.envs.refs import ENV_NAME_RULE, env_name_problem
from hubgym.errors import Where
from hubgym.schemas import KINDS, TASK_FEATURES, Task, task_id, validate_tasks
from hubgym.verifiers.contract import ANSWER_FOUND, Score, Verifier

if TYPE_CHECKING:
    from hubgym.conformance.context import Context

DOC_SECTIONS = ("Task", "Row schema", "Reward", "Arguments", "Version history")
_PURE_FIX = ("keep scoring pure: read shipped data at import time, keep caches in memory, and return values "
             "instead of writing them (stored rollouts are re-scored anywhere, forever)")


# -- the builder and its tasks ---------------------------------------------------------------

def check_declaration(ctx: Context) -> None:
    """The builder class declares a usable name, version, kind, verifier, golden file, configs and docstring."""
    cls, where = ctx.builder, ctx.where
    env = getattr(cls, "ENV", None)
    problem = env_name_problem(env)
    if problem is not None:
        fail(f"{cls.__name__}.ENV is {str(env)[:100]!r}, which {problem}", where(field="ENV"),
             f"set ENV to {ENV_NAME_RULE} (the version goes in ENV_VERSION)")
    version = cls.ENV_VERSION
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        fail(f"ENV_VERSION is {version!r}", where(field="ENV_VERSION"), "use an int >= 1; bump it when rewards change")
    if cls.KIND not in KINDS:
        fail(f"KIND is {cls.KIND!r}", where(field="KIND"), f"use one of {KINDS}")
    for attr in ("VERIFIER", "GOLDEN"):
        if not isinstance(getattr(cls, attr, None), str) or not getattr(cls, attr):
            fail(f"{cls.__name__}.{attr} is not set", where(field=attr),
                 "set VERIFIER to a dotted module or a .py path, GOLDEN to a .jsonl path (relative to the builder)")
    _check_configs(ctx, cls)
    _check_docstring(ctx, cls)


def _check_configs(ctx: Context, cls: Any) -> None:
    names = cls.config_names()
    if not names or len(set(names)) != len(names):
        fail(f"BUILDER_CONFIGS names are {names}", ctx.where(field="BUILDER_CONFIGS"),
             "declare at least one config, each with a distinct name")
    for config in cls.BUILDER_CONFIGS:
        sizes = getattr(config, "sizes", None)
        if not isinstance(sizes, dict) or not sizes or not all(isinstance(n, int) and n >= 1 for n in sizes.values()):
            fail(f"config {config.name!r} has sizes {sizes!r}", ctx.where(config.name, field="sizes"),
                 "give sizes = {split: number of tasks >= 1}, e.g. {'train': 1000, 'test': 100}")
    asked = ctx.requested_configs if isinstance(ctx.requested_configs, list) else []  # not Only.DEFAULT
    unknown = [c for c in asked if c not in names]
    if unknown:
        fail(f"unknown config {unknown[0]!r}; the builder has {names}", ctx.where(unknown[0]),
             "ask for configs by one of the names in BUILDER_CONFIGS")


def _check_docstring(ctx: Context, cls: Any) -> None:
    doc = cls.__dict__.get("__doc__") or getattr(sys.modules.get(cls.__module__), "__doc__", None) or ""
    missing = [s for s in DOC_SECTIONS if not re.search(rf"^\s*{s}:", doc, re.M)]
    if missing:
        fail(f"the builder docstring lacks the section(s) {missing}; users read the env's docs from it",
             ctx.where(field="__doc__"),
             f"give the builder module a docstring with the sections {', '.join(DOC_SECTIONS)} (see arithmetic)")
    if not re.search(rf"^\s*v{cls.ENV_VERSION}:", doc, re.M):
        fail(f"Version history has no entry 'v{cls.ENV_VERSION}:' for ENV_VERSION {cls.ENV_VERSION}",
             ctx.where(field="__doc__"), "add a line saying what changed in this version")


def check_builds(ctx: Context) -> None:
    """Every config builds, and every split holds at least one task."""
    for config in ctx.configs:
        splits = ctx.build(config)
        for split, table in splits.items():
            if len(table) == 0:
                fail(f"split {split!r} is empty", ctx.where(config, split),
                     "give sizes[split] >= 1 and make generate_tasks yield that many rows, or drop the split")


def check_schema(ctx: Context) -> None:
    """Features equal hubgym.schemas.TASK_FEATURES; every table validates; `env` is the builder's ENV."""
    for config in ctx.configs:
        for split, table in ctx.build(config).items():
            where = ctx.where(config, split)
            diff = _feature_diff(table.features, TASK_FEATURES)
            if diff is not None:
                path, got, want = diff
                fail(f"the {split!r} split declares {path!r} as {got}, but the task schema has {want}; most likely "
                     f"the builder overrides _info", Where(ctx.env, config, split, field=path),
                     "do not override _info: TaskBuilder declares hubgym.schemas.TASK_FEATURES; put extra data "
                     "inside info")
            validate_tasks(table.data.table, where)
    for config, split, rows in ctx.splits():
        for row in rows:
            if row["env"] != ctx.builder.ENV:
                fail(f"the env column is {row['env']!r}, not {ctx.builder.ENV!r}",
                     ctx.where(config, split, row["id"], "env"), "pass self.ENV to hubgym.make_task")
            for i, message in enumerate(row["prompt"]):
                if message["role"] in ("system", "user") and message["content"] is None:
                    fail(f"prompt message {i} ({message['role']}) has no content",
                         ctx.where(config, split, row["id"], "prompt.content"),
                         "build messages with hubgym.user(text) / hubgym.system(text)")


def _feature_diff(got: Any, want: Any, path: str = "") -> tuple[str, str, str] | None:
    """The first (path, declared, expected) where two datasets feature trees differ; None when equal."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in [*want, *[k for k in got if k not in want]]:
            if key not in got or key not in want:
                return f"{path}{key}", repr(got.get(key, "nothing")), repr(want.get(key, "no such column"))
            diff = _feature_diff(got[key], want[key], f"{path}{key}.")
            if diff is not None:
                return diff
        return None
    if isinstance(want, datasets.List) and isinstance(got, datasets.List):
        return _feature_diff(got.feature, want.feature, path)
    return None if got == want else (path.rstrip("."), repr(got), repr(want))


def check_ids_unique(ctx: Context) -> None:
    """No id appears twice within a split."""
    for config, split, rows in ctx.splits():
        first: dict[str, int] = {}
        for i, row in enumerate(rows):
            if row["id"] in first:
                fail(f"id {row['id']!r} is used by rows {first[row['id']]} and {i}; most likely two rows are the same "
                     f"task, or ids are not derived from the content", ctx.where(config, split, row["id"], "id"),
                     "build rows with hubgym.make_task (ids are content hashes) and never repeat a task in a split")
            first[row["id"]] = i


def check_ids_stable(ctx: Context) -> None:
    """A second build of the same config and seed, under another clock and time zone, gives the same ids."""
    for config in ctx.configs:
        first, second = ctx.build(config), ctx.build(config, 2)
        for split, table in first.items():
            a, b = table["id"], second[split]["id"] if split in second else []
            if len(a) != len(b):
                fail(f"split {split!r} has {len(a)} rows in one build and {len(b)} in a second build of the same "
                     f"config and seed", ctx.where(config, split), "make the number of rows depend on sizes only")
            missing = set(a) - set(b)
            if missing:
                i = next(i for i, x in enumerate(a) if x in missing)
                path, old, new = _first_path(ctx.rows(config, split)[i], ctx.rows(config, split, 2)[i])
                changed = f" (its {path} changed: {short(old)} then {short(new)})" if path != "id" else ""
                cause, fix = _why_builds_differ(ctx, config, (
                    "most likely the id or the content it hashes depends on a clock, a uuid or an unseeded random "
                    "generator", "draw everything from random.Random(seed) (the seed generate_tasks receives) and "
                    "build rows with hubgym.make_task"))
                fail(f"ids differ between two builds of the same config and seed: row {i} was {a[i]!r}, then "
                     f"{b[i]!r}{changed}; {cause}", ctx.where(config, split, a[i], path), fix)


def _why_builds_differ(ctx: Context, config: str, otherwise: tuple[str, str]) -> tuple[str, str]:
    """(cause, fix) of two builds that differ: the clock when a third build under the first clock gives the first
    build again, else `otherwise`."""
    if not ctx.build_follows_clock(config):
        return otherwise
    return (f"the builds ran under two clocks and time zones ({CHECK_CLOCKS[0]}, then {CHECK_CLOCKS[1]}), and a third "
            f"under the first clock gave the first build's rows again: generate_tasks reads the date, the clock or "
            f"the time zone", CLOCK_FIX)


def _first_path(old: Any, new: Any, path: str = "") -> tuple[str, Any, Any]:
    """(path, old value, new value) of the first place two row values differ, e.g. ("info.date", ...); a row's id
    is named last, since the content it hashes is the cause."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new), key=lambda k: (path == "" and k == "id", str(k)))
        for key in keys:
            if old.get(key, _ABSENT) != new.get(key, _ABSENT):
                return _first_path(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            if a != b:
                return _first_path(a, b, f"{path}[{i}]")
    return path, old, new


_ABSENT = object()


def check_ids_from_content(ctx: Context) -> None:
    """Each id is hubgym.schemas.task_id(env, prompt, info, interaction) of its row."""
    for config, split, rows in ctx.splits():
        for row in rows:
            expected = task_id(row["env"], row["prompt"], row["info"], row["interaction"])
            if row["id"] != expected:
                fail(f"id {row['id']!r} is not derived from the row's content (expected {expected!r}); most likely "
                     f"the row was changed after make_task, or its id was set by hand",
                     ctx.where(config, split, row["id"], "id"),
                     "build each row with one hubgym.make_task(...) call and do not edit it afterwards")


def check_deterministic_rows(ctx: Context) -> None:
    """A second build of the same config and seed, under another clock and time zone, gives identical rows, in the
    same order."""
    for config in ctx.configs:
        first, second = ctx.build(config), ctx.build(config, 2)
        for split, table in first.items():
            if split not in second:
                fail(f"split {split!r} is missing from a second build of the same config and seed",
                     ctx.where(config, split), "make the splits depend on the config only")
            if table.data.table.equals(second[split].data.table):
                continue
            rows_a, rows_b = ctx.rows(config, split), ctx.rows(config, split, 2)
            for i, (a, b) in enumerate(zip(rows_a, rows_b)):
                if a != b:
                    path, old, new = _first_path(a, b)
                    cause, fix = _why_builds_differ(ctx, config, (
                        "most likely generate_tasks uses an unseeded random generator, the clock, or the order of a "
                        "set", "draw everything from random.Random(seed) and iterate over sorted collections"))
                    fail(f"row {i} differs between two builds of the same config and seed ({path}: {short(old)} then "
                         f"{short(new)}); {cause}", ctx.where(config, split, a["id"], path), fix)
            if len(rows_a) != len(rows_b):
                fail(f"split {split!r} has {len(rows_a)} rows, then {len(rows_b)}", ctx.where(config, split),
                     "make the number of rows depend on sizes only")


def check_rows_independent_of_hash_seed(ctx: Context) -> None:
    """A build in a second process, whose PYTHONHASHSEED differs from this one's, gives identical rows: row order
    or content that follows a set's or a dict of sets' iteration order would differ there."""
    for config in ctx.configs:
        first, second = ctx.build(config), ctx.build(config, 2)
        if any(split not in second or not table.data.table.equals(second[split].data.table)
               for split, table in first.items()):
            raise CheckSkipped.because("two builds in this process that agree", "check_deterministic_rows",
                                       ctx.where(config), ctx.check)
        other = ctx.hash_seed_build(config)
        for split, table in ctx.build(config).items():
            if split in other and table.data.table.equals(other[split].data.table):
                continue
            rows_a, rows_b = ctx.rows(config, split), other[split].to_list() if split in other else []
            i = next((i for i, (a, b) in enumerate(zip(rows_a, rows_b)) if a != b), min(len(rows_a), len(rows_b)))
            path, old, new = _first_path(rows_a[i], rows_b[i]) if i < min(len(rows_a), len(rows_b)) else (
                "id", f"{len(rows_a)} rows", f"{len(rows_b)} rows")
            fail(f"row {i} differs between builds in two processes with different hash seeds ({ctx.hash_seeds}) "
                 f"({path}: {short(old)} then {short(new)}); most likely generate_tasks iterates over a set (or "
                 f"a dict built from one), or seeds a generator with hash() of a string",
                 ctx.where(config, split, rows_a[i]["id"] if i < len(rows_a) else None, path),
                 "iterate over sorted(...) collections, and derive seeds with hashlib or zlib.crc32, never hash()")


# -- the verifier ------------------------------------------------------------------------------

def check_verifier_loads(ctx: Context) -> None:
    """The verifier imports and declares REWARDS (and reset/step when the env is multi_turn)."""
    verifier = ctx.verifier
    if ctx.builder.KIND == "multi_turn" and not verifier.multi_turn:
        fail(f"KIND is 'multi_turn' but verifier {verifier.name!r} defines no reset/step", ctx.where(field="step"),
             "define reset(task) -> (state, observation) and step(task, state, action) -> "
             "(state, observation, reward, done)")


def check_interaction(ctx: Context) -> None:
    """Interaction specs make sense: tool_use rows offer tools, multi_turn rows have an MDP, shaping names offered
    tools, and every offered tool is in the builder's TOOLS."""
    verifier, catalog = ctx.verifier, set(ctx.builder.TOOLS)
    for config, split, rows in ctx.splits():
        for row in rows:
            spec, where = row["interaction"], lambda f: ctx.where(config, split, row["id"], f)
            if spec["kind"] == "tool_use" and not spec["tools"]:
                fail("the row is tool_use but offers no tools", where("interaction.tools"),
                     "list its tools in hubgym.interaction('tool_use', tools=[...]), or make it single_turn")
            if spec["kind"] == "multi_turn" and not verifier.multi_turn:
                fail(f"the row is multi_turn but verifier {verifier.name!r} has no reset/step",
                     where("interaction.kind"), "define reset and step in the verifier, or make the row single_turn")
            for name in spec["tools"]:
                if name not in catalog:
                    fail(f"the row offers tool {name!r}, which {ctx.builder.__name__}.TOOLS does not list",
                         where("interaction.tools"), f"add {name!r} to TOOLS (the env catalog lists envs by tool)")
            for shaping in spec["tool_rewards"]:
                if shaping["tool"] not in spec["tools"]:
                    fail(f"tool_rewards shapes calls to {shaping['tool']!r}, which the row does not offer",
                         where("interaction.tool_rewards"), "only shape tools listed in interaction.tools")


# -- golden cases --------------------------------------------------------------------------------

def check_golden_cases(ctx: Context) -> None:
    """Every golden case scores exactly its declared reward (abs tol 1e-6)."""
    verifier, cases, where = ctx.verifier, ctx.golden, ctx.where(field="GOLDEN")
    if not cases:
        fail("the golden file has no cases", where, "add golden cases: at least one earning full reward, one none")
    for case in cases:
        if case.actions is not None and not verifier.multi_turn:
            fail(f"golden case {case.name!r} gives actions, but the verifier has no reset/step", where,
                 "give a completion (a list of messages) instead")
        completion = case.completion
        if case.actions is not None:
            completion = guarded(lambda: verifier.run_episode(case.task, case.actions), where,
                                 f"replaying golden case {case.name!r}").completion()
        score = verifier.score(case.task, completion or [])
        if score.error is not None:
            fail(f"golden case {case.name!r} raised {score.error['type']}: {score.error['message']} while scoring",
                 where, "fix the verifier: a well-formed trajectory must get a reward")
        if abs(score.reward - case.reward) > TOL:
            fail(f"golden case {case.name!r} scored {score.reward!r}, but the golden file declares {case.reward!r} "
                 f"(components {score.components}); most likely the verifier changed what it rewards, or the case "
                 f"is wrong", where,
                 "fix the verifier; or, if the new reward is intended, update the case and bump ENV_VERSION")


def check_golden_extremes(ctx: Context) -> None:
    """At least one golden case earns the top of REWARD_RANGE and one earns the bottom."""
    lo, hi = ctx.verifier.reward_range
    declared = sorted({case.reward for case in ctx.golden})
    for bound, end, earns in ((hi, "top", "full reward"), (lo, "bottom", "no reward")):
        if not any(abs(reward - bound) <= TOL for reward in declared):
            fail(f"no golden case earns the {end} of REWARD_RANGE ({bound!r}); declared rewards: {declared}",
                 ctx.where(field="GOLDEN"),
                 f"add a golden case whose trajectory earns {earns} ({bound!r}), so both ends of the range are tested")


# -- scoring -------------------------------------------------------------------------------------

def check_verifier_pure(ctx: Context) -> None:
    """Scoring touches no network, writes no files and starts no processes (blocked by the purity guard)."""
    for sample, _, violations in ctx.scored(1):
        if violations:
            fail(f"the verifier reached outside itself while scoring {sample.label}: {violations[0]}; most likely "
                 f"it logs to a file, caches on disk or calls a service",
                 ctx.where(sample.config, sample.split, sample.task["id"], "verifier"), _PURE_FIX)


def check_scoring_no_errors(ctx: Context) -> None:
    """Scoring sampled rows (empty reply, generic reply, failed tool call) never raises."""
    verifier = ctx.verifier
    for sample, score, violations in ctx.scored(1):
        if score.error is not None and not violations:  # a guard refusal is check_verifier_pure's failure
            fail(f"the verifier raised {score.error['type']}: {score.error['message']} while scoring {sample.label}; "
                 f"a verifier exception on well-formed input is a bug (the rollout is dropped from training)",
                 ctx.where(sample.config, sample.split, sample.task["id"], _failed_component(verifier, sample.task,
                                                                                            score)),
                 "return a low reward for empty, off-format or wrong replies; raise only for a malformed task row")


def _failed_component(verifier: Verifier, task: Task, score: Score) -> str:
    names = [ANSWER_FOUND] * (verifier.parse_answer is not None) + list(verifier.weights) + [
        "step"] * verifier.multi_turn + ["tool_rewards"] * bool(
        task["interaction"]["tool_rewards"])
    missing = [n for n in names if n not in score.components and not (n == "step" and "steps" in score.components)]
    if missing and missing[0] == ANSWER_FOUND:  # recorded first: parse_answer raised
        return "parse_answer"
    return missing[0] if missing else "verifier"


def check_reward_range(ctx: Context) -> None:
    """Every sampled reward lies within REWARD_RANGE."""
    lo, hi = ctx.verifier.reward_range
    for sample, score, _ in ctx.scored(1):
        if score.reward is not None and not lo - TOL <= score.reward <= hi + TOL:
            fail(f"reward {score.reward!r} for {sample.label} is outside REWARD_RANGE {(lo, hi)} (components "
                 f"{score.components}); most likely REWARD_RANGE leaves out a weighted reward, the step rewards or "
                 f"tool_rewards shaping", ctx.where(sample.config, sample.split, sample.task["id"], "REWARD_RANGE"),
                 "declare REWARD_RANGE = (low, high) bounding the total reward, or rescale the rewards into it")
    _check_shaping_bound(ctx, lo, hi)


def _check_shaping_bound(ctx: Context, lo: float, hi: float) -> None:
    """The most tool shaping a row declares (reward x max_calls of each shaped tool), added to the most (least) the
    golden cases earn without shaping, stays within REWARD_RANGE: rewards are never clamped, so a rollout making
    every shaped call would otherwise store a reward outside the declared range."""
    base = sorted((score.reward - score.components.get("tool_calls", 0.0), sample.label)
                  for sample, score, _ in ctx.scored(1) if sample.config is None and score.reward is not None)
    if not base:
        return
    for config, split, rows in ctx.splits():
        for row in rows:
            shaping = row["interaction"]["tool_rewards"]
            gain = sum(max(r["reward"], 0.0) * r["max_calls"] for r in shaping)
            loss = sum(min(r["reward"], 0.0) * r["max_calls"] for r in shaping)
            (low, lowest), (high, highest) = base[0], base[-1]
            if high + gain > hi + TOL or low + loss < lo - TOL:
                over = high + gain > hi + TOL
                earned, label, total = (high, highest, high + gain) if over else (low, lowest, low + loss)
                terms = ", ".join(f"{r['tool']}: {r['max_calls']} calls x {r['reward']}" for r in shaping)
                fail(f"the row's tool shaping can add {_num(total - earned)} ({terms}) to the {_num(earned)} that "
                     f"{label} earns without shaping: a total of {_num(total)}, {'above' if over else 'below'} "
                     f"REWARD_RANGE {(lo, hi)}; rewards are never clamped, so a rollout making every shaped call would "
                     f"store a reward outside the declared range", ctx.where(config, split, row["id"],
                                                                             "interaction.tool_rewards"),
                     f"declare REWARD_RANGE = ({_num(min(lo, low + loss))}, {_num(max(hi, high + gain))}), or lower "
                     f"the shaping's max_calls or reward")


def _num(value: float) -> float:
    """A sum of float rewards as it should read: 1.3, not 1.3000000000000003."""
    return round(value, 9)


def check_scoring_deterministic(ctx: Context) -> None:
    """Scoring the same trajectory again and again (on fresh copies of its inputs, in a shuffled order, under
    another clock and time zone) gives the same Score every time."""
    for (sample, first, _), (_, again) in zip(ctx.scored(1), ctx.rescored()):
        other = next((b for b in again if not same_score(first, b)), None)
        if other is None:
            continue
        where = ctx.where(sample.config, sample.split, sample.task["id"], "verifier")
        clocked = ctx.follows_the_clock(sample)
        if clocked is not None:
            fail(f"scoring {sample.label} under two clocks and time zones ({CHECK_CLOCKS[0]}, then "
                 f"{CHECK_CLOCKS[1]}) gave {score_summary(clocked[0])}, then {score_summary(clocked[1])}, and under "
                 f"the first clock again {score_summary(clocked[0])}: the verifier reads the date, the clock or the "
                 "time zone", where, SCORE_CLOCK_FIX)
        rate = sum(not same_score(first, b) for b in again)
        fail(f"scoring {sample.label} twice gave {score_summary(first)}, then {score_summary(other)}; most likely the "
             f"verifier uses an unseeded random generator, the clock, or state kept between calls (it differed in "
             f"{rate} of {len(again)} scorings of the same trajectory)", where, SEEDED_FIX)


def check_scoring_leaves_its_inputs(ctx: Context) -> None:
    """Scoring changes neither the task nor the completion it is given."""
    fresh = {f"golden case {case.name!r}": case for case in ctx.builder.golden_cases()}  # read again: unscored
    for sample in ctx.samples:
        if sample.config is None:  # a golden case: check_golden_cases scored (and so maybe changed) the loaded one
            case = fresh.get(sample.label)
            if case is None or case.completion is None:
                continue
            sample = Sample(None, None, case.task, sample.label, case.completion)
        task, completion = copy.deepcopy(sample.task), copy.deepcopy(sample.completion or [])
        before = _canonical(task, completion)
        ctx.verifier.score(task, completion)
        after = _canonical(task, completion)
        for what, old, new in (("task", before[0], after[0]), ("completion", before[1], after[1])):
            if old != new:
                fail(f"scoring {sample.label} changed the {what} it was given "
                     f"({_first_change(json.loads(old), json.loads(new))}); the "
                     f"rollout loop scores all samples of a group with one task object, and a re-score builds each "
                     f"row's anew, so stored rewards would depend on the order samples finish and a re-score would "
                     f"not reproduce them", ctx.where(sample.config, sample.split, sample.task["id"], "verifier"),
                     "copy what a reward needs to change (e.g. dict(task['info'])); never change the task or the "
                     "messages it receives")


def _first_change(old: Any, new: Any, path: str = "") -> str:
    """Where two JSON values first differ, e.g. "info.answer was added (None)"."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in new:
                return f"{where} was removed"
            if key not in old:
                return f"{where} was added ({short(new[key])})"
            if old[key] != new[key]:
                return _first_change(old[key], new[key], where)
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            if a != b:
                return _first_change(a, b, f"{path}[{i}]")
    return f"{path or 'it'} went from {short(old)} to {short(new)}"


def _canonical(task: Task, completion: list) -> tuple[str, str]:
    """The task and completion as JSON text: equal exactly when nothing in them changed (NaN included)."""
    return tuple(json.dumps(value, sort_keys=True, default=repr) for value in (task, completion))


CHECKS: list[Callable[[Context], None]] = [
    check_declaration,
    check_builds,
    check_schema,
    check_ids_unique,
    check_ids_stable,
    check_ids_from_content,
    check_deterministic_rows,
    check_rows_independent_of_hash_seed,
    check_held_out_apart,
    check_verifier_loads,
    check_interaction,
    check_tool_schemas,
    check_tools_run,
    check_golden_cases,
    check_golden_extremes,
    check_scoring_leaves_its_inputs,  # before the scoring checks score (and so change) the rows it copies
    check_verifier_pure,
    check_scoring_no_errors,
    check_reward_range,
    check_scoring_deterministic,
    check_scoring_leaves_global_random_alone,
    check_scoring_independent_of_hash_seed,
    check_scoring_independent_of_environment,
    check_scoring_stable_over_many_calls,
    check_batch_rows_independent,
    check_reset_step_deterministic,
    check_golden_replay,
]
"""The checks, in the order they run: builder, tasks, verifier, golden cases, scoring (its process: global random
state, hash seed, environment, age), multi_turn."""

PROCESS_CHECKS = (check_rows_independent_of_hash_seed, check_scoring_leaves_global_random_alone,
                  check_scoring_independent_of_hash_seed, check_scoring_independent_of_environment,
                  check_scoring_stable_over_many_calls)
"""The checks that start other processes, fresh imports or long loops (seconds an env): what makes `hubgym check`
slow. Envs of one family share their builder and verifier code, so a sweep over a family can run these on a few
of its envs and the rest of CHECKS (`per_env_checks()`) on every one."""


def per_env_checks() -> list[Callable[[Context], None]]:
    """CHECKS without PROCESS_CHECKS, in order."""
    return [check for check in CHECKS if check not in PROCESS_CHECKS]
