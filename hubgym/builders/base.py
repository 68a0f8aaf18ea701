"""TaskBuilder: an environment's task generator, as a Hugging Face `datasets` builder.

A builder is a config dataclass plus `generate_tasks`. The base class supplies the fixed task
features (`_info`), one split per entry of `config.sizes` (`_split_generators`, override it to
read real data), and `_generate_examples`, which checks every row and keys it by its
content-derived id.

    class Countdown(TaskBuilder):
        ENV, VERIFIER, GOLDEN = "countdown", "hubgym.verifiers.countdown", "golden/countdown.jsonl"
        BUILDER_CONFIGS = [TaskConfig(name="easy")]

        def generate_tasks(self, split, size, seed):
            rng = random.Random(seed)
            ...
            yield make_task(self.ENV, [user(question)], {"answer": answer})
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Callable, ClassVar, Hashable, Iterator, TypeVar

import datasets

from hubgym.errors import EnvContractError, VerifierLoadError, Where
from hubgym.schemas.tasks import TASK_COLUMNS, TASK_FEATURES, Kind, Task
from hubgym.verifiers.contract import Verifier, load_verifier
from hubgym.verifiers.golden import GoldenCase, load_golden

T = TypeVar("T")


@dataclass
class TaskConfig(datasets.BuilderConfig):
    """A builder config: a name, a seed, and how many tasks each split gets."""

    seed: int = 0
    sizes: dict[str, int] = field(default_factory=lambda: {"train": 1000, "test": 100})


class TaskBuilder(datasets.GeneratorBasedBuilder):
    """Base class of every environment builder. Subclasses set the class attributes below."""

    ENV: ClassVar[str]  # name, and the value of the `env` column
    ENV_VERSION: ClassVar[int] = 1  # bump when what the verifier rewards changes
    KIND: ClassVar[Kind] = "single_turn"  # the interaction kind of (most of) its rows
    VERIFIER: ClassVar[str]  # dotted module name, or a .py path relative to the builder's file
    GOLDEN: ClassVar[str]  # golden cases (JSONL), relative to the builder's file
    TOOLS: ClassVar[tuple[str, ...]] = ()  # tools its rows may offer (for the catalog)
    # The env's own tools: a .py path relative to the builder's file (or a dotted module) whose @hubgym.tool
    # functions and ToolSet classes its rows may offer by name. It ships with the env (push uploads it).
    TOOLS_MODULE: ClassVar[str | None] = None
    # True when each row is an independent random draw (a procedural generator seeded per row): a task mixture
    # then serves rows in generated order instead of shuffling them in blocks, so opening the env costs one row.
    ROWS_IN_RANDOM_ORDER: ClassVar[bool] = False
    TAGS: ClassVar[tuple[str, ...]] = ()  # free-form lowercase words the catalog filters on: ("math", "games")

    BUILDER_CONFIG_CLASS = TaskConfig
    BUILDER_CONFIGS = [TaskConfig(name="default")]
    DEFAULT_CONFIG_NAME = None  # the first config
    # Configs a family leaves out of this env, with why (e.g. reasoning-gym's `hard` ones that hang): asking for one
    # says why it is missing instead of only that it is.
    LEFT_OUT_CONFIGS: ClassVar[dict[str, str]] = {}
    # Configs whose other splits hold the train split's tasks on purpose, with why (arithmetic's `tiny`: a demo that
    # measures how a tiny model fits 25 sums): `hubgym check` holds every other config's held-out splits apart.
    SHARED_SPLITS: ClassVar[dict[str, str]] = {}

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(description=inspect.getdoc(type(self)) or "", features=TASK_FEATURES)

    def _split_generators(self, dl_manager) -> list[datasets.SplitGenerator]:
        """One split per `config.sizes` entry, each with its own seed derived from the config seed."""
        return [
            datasets.SplitGenerator(name=split, gen_kwargs={"split": split, "size": size,
                                                            "seed": split_seed(self.config.seed, split)})
            for split, size in self.config.sizes.items()
        ]

    def generate_tasks(self, split: str, **kwargs: Any) -> Iterator[Task]:
        """Yield task rows (built with `hubgym.make_task`) for one split. Must be deterministic."""
        raise EnvContractError(f"{type(self).__name__} does not define generate_tasks",
                               Where(self.ENV, self.config.name, split),
                               "define generate_tasks(self, split, **gen_kwargs) yielding rows from hubgym.make_task")

    def _generate_examples(self, split: str, **kwargs: Any) -> Iterator[tuple[str, Task]]:
        seen: set[str] = set()
        for row in _located(self.generate_tasks(split, **kwargs), Where(self.ENV, self.config.name, split)):
            where = Where(self.ENV, self.config.name, split, row.get("id"))
            _check_row(row, where)
            if row["id"] in seen:
                raise EnvContractError(f"task id {row['id']!r} was generated twice",
                                       Where(**{**where.__dict__, "field": "id"}),
                                       "generate_tasks must not repeat a task: draw until the split has `size` "
                                       "distinct tasks")
            seen.add(row["id"])
            yield row["id"], {**row, "split": row.get("split") or split, "tags": row["tags"] or list(self.TAGS)}

    def split_names(self) -> list[str]:
        """The splits this config generates (`_split_generators`, run once per instance)."""
        return list(self._split_kwargs())

    def iter_tasks(self, split: str) -> Iterator[Task]:
        """The rows of one split, generated now and checked as a build checks them, in the order a build stores
        them: the one path of every reader that draws tasks (hubgym.envs.OpenedEnv.rows). Nothing is written."""
        kwargs = self._split_kwargs()
        if split not in kwargs:
            raise EnvContractError(f"env {self.ENV!r} config {self.config.name!r} has no split {split!r}",
                                   Where(self.ENV, self.config.name, split),
                                   f"choose one of its splits: {', '.join(kwargs)}")
        return (row for _, row in self._generate_examples(**kwargs[split]))

    def _split_kwargs(self) -> dict[str, dict[str, Any]]:
        if not hasattr(self, "_kwargs_by_split"):  # a builder that reads source data reads it once
            self._kwargs_by_split = {g.name: g.gen_kwargs for g in self._split_generators(None)}
        return self._kwargs_by_split

    # -- the environment around the builder ------------------------------------------------

    @classmethod
    def env_id(cls) -> str:
        """Versioned id, e.g. 'arithmetic-v1'."""
        return f"{cls.ENV}-v{cls.ENV_VERSION}"

    @classmethod
    def source_dir(cls) -> Path:
        return Path(inspect.getfile(cls)).parent

    @classmethod
    def verifier(cls) -> Verifier:
        return _verifier(cls)

    @classmethod
    def golden_cases(cls) -> list[GoldenCase]:
        return load_golden(cls.source_dir() / cls.GOLDEN, env=cls.ENV, kind=cls.KIND)

    @classmethod
    def config_names(cls) -> list[str]:
        return [c.name for c in cls.BUILDER_CONFIGS]

    @classmethod
    def no_config(cls, config: str, fix: str) -> EnvContractError:
        """The error for a config this env does not have; `fix` says how to name one of those it has."""
        return no_config_error(cls.ENV, config, fix, cls.LEFT_OUT_CONFIGS.get(config))


def no_config_error(env: str, config: str, fix: str, why: str | None = None) -> EnvContractError:
    """`env` has no config `config` (`why`: the reason a family left it out, when it did)."""
    return EnvContractError(f"env {env!r} has no config {config!r}" + (f" (left out: {why})" if why else ""),
                            Where(env=env, config=config), fix)


@cache
def _verifier(cls: type[TaskBuilder]) -> Verifier:
    """The verifier, with the env's own tools (TOOLS_MODULE) loaded beside it."""
    verifier = load_verifier(cls.VERIFIER, relative_to=cls.source_dir(), env=cls.ENV)
    if cls.TOOLS_MODULE:
        from hubgym.tools.modules import load_tools

        try:
            verifier.tools = load_tools(cls.TOOLS_MODULE, relative_to=cls.source_dir(), env=cls.ENV)
        except Exception as exc:
            raise VerifierLoadError(f"the tools module {cls.TOOLS_MODULE!r} failed to load: {type(exc).__name__}: "
                                    f"{exc}", Where(cls.ENV, field="TOOLS_MODULE"),
                                    "fix the tools module (it must import on its own, with @hubgym.tool functions "
                                    "or ToolSet classes at module level), or the TOOLS_MODULE path") from exc
    return verifier


def _located(rows: Iterator[Task], where: Where) -> Iterator[Task]:
    """`rows`, with the env, config and split added to a row error raised while making them (make_task knows the
    env and the field, not the config or split)."""
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except EnvContractError as exc:
            if exc.where.config is None and exc.where.split is None:
                exc.__init__(exc.what, Where(where.env, where.config, where.split, exc.where.row, exc.where.field),
                             exc.fix, exc.check)
            raise
        yield row


def split_seed(seed: int, split: str) -> int:
    """A per-split seed, so train and test draw different tasks from the same config seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{split}".encode()).digest()[:4], "big")


SPENT = 100_000
"""Draws in a row that bring no new task, after which `distinct` takes the task space to be spent."""


def distinct(draw: Callable[[], T], size: int, *, key: Callable[[T], Hashable] | None = None,
             keep: Callable[[T], bool] | None = None) -> Iterator[T]:
    """Up to `size` draws that differ (by `key`, default the draw itself; `keep` turns others away), in the order
    drawn: a split that never repeats a task. After SPENT draws in a row that bring nothing new the task space is
    spent and the split ends there, smaller than `size` (10**12 tasks asked of a space of 400 end at 400 instead
    of drawing forever).

        rng = random.Random(seed)
        for a, b in distinct(lambda: (rng.randint(0, 99), rng.randint(0, 99)), size):
            yield make_task(...)
    """
    seen: set[Hashable] = set()
    misses = 0
    while len(seen) < size and misses < SPENT:
        item = draw()
        name = item if key is None else key(item)
        if name in seen or (keep is not None and not keep(item)):
            misses += 1
            continue
        seen.add(name)
        misses = 0
        yield item


def _check_row(row: Any, where: Where) -> None:
    if not isinstance(row, dict):
        raise EnvContractError(f"generate_tasks yielded {type(row).__name__}, not a task dict", where,
                               "yield rows built with hubgym.make_task(...)")
    missing = [c for c in TASK_COLUMNS if c not in row]
    if missing:
        raise EnvContractError(f"task row lacks {missing}", Where(**{**where.__dict__, "field": missing[0]}),
                               "build rows with hubgym.make_task(...), which fills every column")
    if not isinstance(row["info"], dict):
        raise EnvContractError(f"info is {type(row['info']).__name__}, not a dict",
                               Where(**{**where.__dict__, "field": "info"}),
                               "put everything the verifier needs in a JSON object")
