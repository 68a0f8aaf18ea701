"""What the checks of one run share (`Context`): the builder class, the built tasks of each config (a first and
a second build, for determinism; so an env is built at most three times per config, plus once in a second
process), the loaded verifier, the golden cases, and the scored samples. Each is made on first use, at most once.

Clocks: the first build and scoring pass run under one fake clock and time zone, the second under
another (hubgym.builders.clock.CHECK_CLOCKS), so rows or rewards that read the date, the clock or
the zone differ between them; when they do, a third build or pass under the first clock tells the
clock apart from an unseeded random generator. One more build runs in a second process with another
PYTHONHASHSEED (hubgym.conformance.rebuild): rows that follow the order of a set differ there.

Prerequisites: when making one of those fails (the builder does not import, a config does not build, the verifier
does not load, the golden file is malformed), the check that first needed it fails with the cause; every later
check that needs it is reported as skipped ("<check>: skipped: needs <what>, which failed in <check> [...]").
"""

from __future__ import annotations

import contextlib
import copy
import enum
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import datasets
import pyarrow as pa

from hubgym.builders.base import TaskBuilder
from hubgym.envs.build import build_tasks, make_builder
from hubgym.builders.clock import CHECK_CLOCKS, Clock, at_clock
from hubgym.envs import resolve_env
from hubgym.conformance.common import (CheckSkipped, Sample, generator_moved, global_random_state, same_score,
                                      score_with)
from hubgym.conformance.purity import Violation, purity_guard
from hubgym.conformance.rebuild import build_elsewhere, hash_seeds, importable_ref, score_elsewhere
from hubgym.errors import EnvContractError, EnvNotFoundError, VerifierLoadError, Where
from hubgym.schemas import Message, Task, assistant, tool_call, tool_result
from hubgym.schemas.messages import TOOL_ERROR_PREFIX
from hubgym.schemas.tasks import TASK_COLUMNS, TASK_FEATURES
from hubgym.verifiers.contract import Score, Verifier
from hubgym.verifiers.golden import GoldenCase

GENERIC_REPLY = "I am not sure. My best guess is 42."
SYNTHETIC_REPLIES: dict[str, str] = {"the empty reply": "", "a generic reply": GENERIC_REPLY,
                                     "a reply padded with spaces": "  <answer> 42 </answer>\n"}
"""Completions every sampled row is scored with: a verifier must return a reward (usually low) for each. The padded
one shows a reward that strips a message's text in place (`check_scoring_leaves_its_inputs`)."""
RESCORES = 400
"""Scorings of the second pass, at least (each sample scored again up to MAX_REPEATS times): enough that a reward
wrong on 5% of calls shows with near certainty (a miss chance below 1e-15)."""
MAX_REPEATS = 16

ATTEMPT_CLOCKS: dict[int, Clock] = {1: CHECK_CLOCKS[0], 2: CHECK_CLOCKS[1], 3: CHECK_CLOCKS[0]}
"""The clock of each build and scoring pass: the second differs from the first in every field of the date, the
time and the zone; the third, made only to tell why the first two differ, repeats the first."""
CLOCK_PATTERN = (1, 2, 2, 1, 1, 2)
"""The clocks (keys of ATTEMPT_CLOCKS) a differing score is re-scored under before the clock is blamed."""
_ORDINAL = {1: "first", 2: "second", 3: "third"}



class Only(enum.Enum):
    """`configs=Only.DEFAULT`: check only the config an env builds when none is named (its first); what checking
    many envs does by default, where every config of 90 generated envs would multiply the time for little."""

    DEFAULT = "the default config"


Configs = list[str] | Only | None  # named configs, Only.DEFAULT, or None: every config


class Context:
    """What the checks of one run share; every resource is made once, on first use."""

    def __init__(self, ref: str | type[TaskBuilder], configs: Configs, max_rows: int, workdir: Path,
                 build_rows: int | None = None):
        self.ref, self.requested_configs, self.max_rows, self.workdir = ref, configs, max_rows, workdir
        self.build_rows = build_rows  # each split built with at most this many rows (None: every row)
        self.check = ""  # the check now running (prerequisite failures are attributed to it)
        self._memo: dict[str, tuple[Any, ...]] = {}
        self._rows: dict[tuple[str, str, int], list[Task]] = {}
        self.global_draws: list[tuple[Sample, str]] = []  # scorings that moved a global random generator, and which
        self.env = ref if isinstance(ref, str) else getattr(ref, "__name__", str(ref))
        with contextlib.suppress(Exception):  # the failure is kept, and reported by the first check that needs it
            self.env = self.builder.ENV

    def resource(self, key: str, describe: str, make: Callable[[], Any]) -> Any:
        """`make()` once. Its failure is raised to the first check that needs it (outside a check, it waits
        for one); every later caller gets CheckSkipped naming that check."""
        if key not in self._memo:
            try:
                self._memo[key] = ("ok", make())
            except CheckSkipped as skipped:  # a prerequisite of this resource failed earlier
                self._memo[key] = ("skip", skipped.needs, skipped.owner)
            except Exception as exc:
                self._memo[key] = ("error", exc, describe)
        state, *value = self._memo[key]
        if state == "ok":
            return value[0]
        if state == "error" and self.check:
            exc, describe = value
            self._memo[key] = ("skip", describe, self.check)  # reported now, by this check
            raise exc
        if state == "error":
            raise value[0]
        raise CheckSkipped.because(value[0], value[1], Where(env=self.env), self.check)

    def where(self, config: str | None = None, split: str | None = None, row: str | None = None,
              field: str | None = None) -> Where:
        return Where(self.env, config, split, row, field)

    # -- resources ---------------------------------------------------------------------------

    @property
    def builder(self) -> type[TaskBuilder]:
        return self.resource("builder", "loading the builder", lambda: load_builder(self.ref))

    @property
    def configs(self) -> list[str]:
        """The configs to check: those asked for that exist (check_declaration reports unknown ones); every one
        when none is named; the first, which loading the env without a config builds, for Only.DEFAULT."""
        known = self.builder.config_names()
        if self.requested_configs is Only.DEFAULT:
            return known[:1]
        return [c for c in self.requested_configs if c in known] if self.requested_configs else known

    def build(self, config: str, attempt: int = 1) -> dict[str, Any]:
        """{split: datasets.Dataset} of one config, built under ATTEMPT_CLOCKS[attempt]; attempt 2 is the
        independent second build, attempt 3 repeats the first's clock."""
        describe = f"the {_ORDINAL[attempt]} build of config {config!r}"

        def make() -> dict[str, Any]:
            if attempt > 1:
                self.build(config)  # no later build when the first failed (that failure is the cause)
            with at_clock(ATTEMPT_CLOCKS[attempt]):
                return build_config(self.builder, config, self.workdir / f"{config}-{attempt}", self.where(config),
                                    attempt, self.build_rows)

        return self.resource(f"build:{attempt}:{config}", describe, make)

    def rows(self, config: str, split: str, attempt: int = 1) -> list[Task]:
        """Decoded rows (info as a dict) of one split, cached."""
        key = (config, split, attempt)
        if key not in self._rows:
            self._rows[key] = self.build(config, attempt)[split].to_list()
        return self._rows[key]

    def splits(self, attempt: int = 1) -> Iterator[tuple[str, str, list[Task]]]:
        """(config, split, rows) for every checked config."""
        for config in self.configs:
            for split in self.build(config, attempt):
                yield config, split, self.rows(config, split, attempt)

    @property
    def verifier(self) -> Verifier:
        return self.resource("verifier", "loading the verifier", lambda: load_verifier_of(self.builder, self.where()))

    @property
    def golden(self) -> list[GoldenCase]:
        return self.resource("golden", "loading the golden cases",
                             lambda: load_golden_cases(self.builder, self.where()))

    @property
    def samples(self) -> list[Sample]:
        return self.resource("samples", "collecting rows to score", self._collect_samples)

    def scored(self, attempt: int) -> list[tuple[Sample, Score, list[Violation]]]:
        """Every sample scored under the purity guard and ATTEMPT_CLOCKS[attempt]; attempt 2 is the independent
        second scoring (its first repeat; `rescored` has them all)."""
        if attempt == 2:
            return [(sample, scores[0], []) for sample, scores in self.rescored()]

        def make() -> list[tuple[Sample, Score, list[Violation]]]:
            with at_clock(ATTEMPT_CLOCKS[attempt]):
                return [(s, *self.score_guarded(s)) for s in self.samples]

        return self.resource(f"scored:{attempt}", f"scoring pass {attempt}", make)

    def rescored(self) -> list[tuple[Sample, list[Score]]]:
        """The second pass: every sample scored again `repeats` times, under the second clock, each time on a fresh
        copy of its task and completion, all in one seeded shuffled order (so a reward that depends on call
        order, object identity, a counter or chance shows, even at a low rate; the copies all live to the end of
        the pass, so no two share an address)."""
        def make() -> list[tuple[Sample, list[Score]]]:
            samples = self.samples
            repeats = max(2, min(MAX_REPEATS, -(-RESCORES // max(len(samples), 1))))
            order = [(i, r) for i in range(len(samples)) for r in range(repeats)]
            random.Random(len(order)).shuffle(order)
            scores: list[list[Score]] = [[] for _ in samples]
            alive = []  # every copy lives to the end of the pass, so each has its own address (id)
            with at_clock(ATTEMPT_CLOCKS[2]):
                for i, _ in order:
                    alive.append(copy.deepcopy(samples[i]))
                    scores[i].append(self.score_guarded(alive[-1])[0])
            return list(zip(samples, scores))

        return self.resource("rescored", "scoring pass 2", make)

    def hash_seed_build(self, config: str) -> dict[str, Any]:
        """{split: datasets.Dataset} of `config` built in a second process with another PYTHONHASHSEED (one
        process builds every checked config); CheckSkipped when that process cannot import the builder."""
        ref = importable_ref(self.ref, self.builder)
        if ref is None:
            raise CheckSkipped(f"skipped: builder {self.builder.__qualname__} cannot be imported by name in a second "
                               f"process, so the hash seed cannot be varied", self.where(),
                               "define the builder at module level (or check it by name or by folder)",
                               check=self.check)

        def make() -> dict[str, dict[str, Any]]:
            for name in self.configs:
                self.build(name)  # no second process when a build fails here (that failure is the cause)
            try:
                return build_elsewhere(ref, self.configs, self.workdir / "hash-seed", hash_seeds()[1],
                                       self.build_rows)
            except RuntimeError as exc:
                raise EnvContractError(f"the configs build here, but not in a second process ({self.hash_seeds}): "
                                       f"{exc}", self.where(), "make generate_tasks independent of the hash seed: "
                                       "iterate over sorted collections, never hash() of a string") from exc

        return self.resource("hash-seed", "the build in a second process", make)[config]

    def hash_seed_scores(self, samples: list[Sample]) -> list[Score]:
        """`samples` scored in the second process of `hash_seed_build` (another PYTHONHASHSEED), under the first
        check clock; CheckSkipped when that process cannot import the builder."""
        ref = importable_ref(self.ref, self.builder)
        if ref is None:
            raise CheckSkipped(f"skipped: builder {self.builder.__qualname__} cannot be imported by name in a second "
                               f"process, so the hash seed cannot be varied", self.where(),
                               "define the builder at module level (or check it by name or by folder)",
                               check=self.check)
        try:
            return score_elsewhere(ref, samples, hash_seeds()[1])
        except RuntimeError as exc:
            raise EnvContractError(f"the verifier scores here, but not in a second process ({self.hash_seeds}): "
                                   f"{exc}", self.where(field="VERIFIER"),
                                   "make the verifier independent of the hash seed: never hash() of a string") from exc

    @property
    def hash_seeds(self) -> str:
        ours, theirs = hash_seeds()
        return f"PYTHONHASHSEED {ours} here, {theirs} there"

    def build_follows_clock(self, config: str) -> bool:
        """Whether the first two builds of `config` differ because of the clock alone: a third build under the
        first clock gives the first build's rows again."""
        return all(table.data.table.equals(self.build(config, 3)[split].data.table)
                   for split, table in self.build(config).items() if split in self.build(config, 3))

    # -- scoring -----------------------------------------------------------------------------

    def _collect_samples(self) -> list[Sample]:
        samples = []
        for config, split, rows in self.splits():
            for row in rows[: self.max_rows]:
                for label, completion in synthetic_completions(row).items():
                    samples.append(Sample(config, split, row, label, completion))
        with contextlib.suppress(EnvContractError):  # a bad golden file is check_golden_cases' failure
            samples += [Sample(None, None, c.task, f"golden case {c.name!r}", c.completion, c.actions)
                        for c in self.golden]
        return samples

    def follows_the_clock(self, sample: Sample) -> tuple[Score, Score] | None:
        """(score under the first clock, under the second) when scoring this very sample object under the two
        clocks in the order of CLOCK_PATTERN gives one score under each; None otherwise. One object throughout, so
        a reward keyed on object identity gives it one score under both; the pattern is not periodic, so a reward
        keyed on a call counter or on chance breaks it."""
        scores: dict[int, list[Score]] = {attempt: [] for attempt in set(CLOCK_PATTERN)}
        for attempt in CLOCK_PATTERN:
            with at_clock(ATTEMPT_CLOCKS[attempt]):
                scores[attempt].append(self.score_guarded(sample)[0])
        first, second = scores[1], scores[2]
        steady = all(same_score(first[0], s) for s in first) and all(same_score(second[0], s) for s in second)
        return (first[0], second[0]) if steady and not same_score(first[0], second[0]) else None

    def score_guarded(self, sample: Sample) -> tuple[Score, list[Violation]]:
        """Score one sample with network, file writes and processes refused; returns what was refused."""
        verifier = self.verifier
        before = global_random_state()
        with purity_guard() as violations:
            score = score_with(verifier, sample)
        moved = generator_moved(before, global_random_state())
        if moved is not None:
            self.global_draws.append((sample, moved))
        return score, list(violations)


def synthetic_completions(row: Task) -> dict[str, list[Message]]:
    """The replies every sampled row is scored with; rows offering tools also get a failed tool call."""
    out = {label: [assistant(text)] for label, text in SYNTHETIC_REPLIES.items()}
    for name in row["interaction"]["tools"][:1]:
        out["a failed tool call"] = [
            assistant(None, [tool_call("call_0", name, "{}")]),
            tool_result(f"{TOOL_ERROR_PREFIX}InvalidArguments: (a failed call made up by the checker)", "call_0", name),
            assistant(GENERIC_REPLY),
        ]
    return out


# -- making the shared resources -------------------------------------------------------------

def load_builder(ref: str | type[TaskBuilder]) -> type[TaskBuilder]:
    try:
        return resolve_env(ref)
    except EnvNotFoundError as exc:
        raise EnvContractError(f"cannot find the env: {exc}", Where(env=str(ref)),
                               "give a built-in name, an installed entry point, or a folder holding builder.py"
                               ) from exc
    except Exception as exc:
        raise EnvContractError(f"the builder failed to import: {type(exc).__name__}: {exc}", Where(env=str(ref)),
                               "fix the builder module (import it in Python to see the traceback)") from exc


def load_verifier_of(cls: type[TaskBuilder], where: Where) -> Verifier:
    try:
        return cls.verifier()
    except EnvContractError:
        raise
    except Exception as exc:
        raise VerifierLoadError(f"verifier {getattr(cls, 'VERIFIER', None)!r} failed to import: "
                                f"{type(exc).__name__}: {exc}", replace(where, field="VERIFIER"),
                                "fix the verifier module; it must import cleanly, with no side effects") from exc


def load_golden_cases(cls: type[TaskBuilder], where: Where) -> list[GoldenCase]:
    try:
        return cls.golden_cases()
    except EnvContractError:
        raise
    except Exception as exc:
        raise EnvContractError(f"the golden cases failed to load: {type(exc).__name__}: {exc}",
                               replace(where, field="GOLDEN"),
                               "set GOLDEN to a JSONL file next to the builder (see hubgym.verifiers.golden)") from exc


def build_config(cls: type[TaskBuilder], config: str, cache_dir: Path, where: Where, attempt: int,
                 max_rows: int | None = None) -> dict[str, Any]:
    """Build one config into a fresh cache folder (each split at most `max_rows` rows); a failure names the split,
    row and field when it can."""
    try:
        return dict(build_tasks(cls, config, cache_dir=cache_dir, max_rows=max_rows))
    except Exception as exc:
        contract = _find_cause(exc, EnvContractError)
        if contract is not None:  # the builder's own row checks (duplicate id, missing column...) said why
            raise contract from None
        root = _root_cause(exc)
        what = (f"config {config!r} failed to build: " if attempt == 1 else
                f"config {config!r} built once, but its {_ORDINAL[attempt]} build failed: "
                ) + f"{type(root).__name__}: {root}"
        split, row, field, in_generator = _locate_bad_row(cls, config, cache_dir.with_name(cache_dir.name + "-x"))
        if field is not None:
            raise EnvContractError(
                f"{what}; the row's {field!r} value does not fit the task schema", replace(where, split=split, row=row,
                                                                                            field=field),
                "build rows with hubgym.make_task(...) and messages with hubgym.user()/assistant()/system(); put "
                "extra data inside info") from exc
        fix = ("make generate_tasks independent of state left by an earlier build (module-level counters, caches)"
               if attempt > 1 else "fix generate_tasks (see the error); it must yield rows for every split in sizes")
        raise EnvContractError(what, replace(where, split=split if in_generator else None), fix) from exc


def _locate_bad_row(cls: type[TaskBuilder], config: str,
                    cache_dir: Path) -> tuple[str | None, str | None, str | None, bool]:
    """Generate the rows again, outside datasets, to name the first (split, row, column) that does not encode."""
    split: str | None = None
    try:
        builder = make_builder(cls, config, cache_dir)
        for generator in builder._split_generators(None):  # a builder that downloads data needs a real manager
            split = generator.name
            for _, row in builder._generate_examples(**generator.gen_kwargs):
                for column in TASK_COLUMNS:
                    features = datasets.Features({column: TASK_FEATURES[column]})
                    try:
                        pa.Table.from_pylist([features.encode_example({column: row[column]})],
                                             schema=features.arrow_schema)
                    except Exception:
                        return split, row.get("id"), column, True
    except Exception:
        return split, None, None, split is not None
    return None, None, None, False


def _find_cause(exc: BaseException, kind: type[EnvContractError]) -> EnvContractError | None:
    """datasets wraps a builder's exception in DatasetGenerationError; find ours in the chain."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _root_cause(exc: BaseException) -> BaseException:
    seen: set[int] = set()
    while (exc.__cause__ or exc.__context__) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return exc
