"""The reasoning-gym family: every procedural generator of `reasoning-gym` as a hubgym env `rg_<name>`.

    from hubgym.bridges.reasoning_gym import FAMILY, EXCLUDED
    [e.name for e in FAMILY.entries()][:3]      # ['rg_ab', 'rg_acre', 'rg_advanced_geometry']
                                                # (no import of reasoning_gym)
    builder = FAMILY.builder("rg_basic_arithmetic")
    hubgym.build_tasks(builder, "easy")["test"]   # 100 rows, none of whose questions is in train
    EXCLUDED["codeio"]                            # why a generator is not an env

Each env is single_turn: the prompt is the generator's question under a system prompt asking for the answer
inside <answer></answer>; `info` holds the generator's entry and what rebuilds its scorer (see
hubgym.bridges.reasoning_gym_verifier). Configs: `default` (the generator's own defaults) and, where the generator
has a curriculum, `easy` and `hard` (its lowest and highest global level). Which generators and configs are
bridged, with their config fields, is decided by probing the installed package (see
hubgym.bridges.reasoning_gym_probe) and shipped as JSON beside this module, so listing needs no import.

Regenerate after upgrading reasoning-gym:  python -m hubgym.bridges.reasoning_gym_probe
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, Iterator

from hubgym.builders.base import TaskBuilder, TaskConfig, split_seed
from hubgym.builders.clock import Clock, at_clock
from hubgym.builders.families import FamilyEnv, load_index, unknown_env
from hubgym.errors import EnvContractError, EnvNotFoundError, Where
from hubgym.schemas import Task, make_task, system, user
from hubgym.bridges.reasoning_gym_shipped import GOLDEN_DIR, INDEX, SPECS, load_specs  # noqa: F401 (re-exported)
from hubgym.bridges.reasoning_gym_verifier import prints_dropped, score_entry

SYSTEM_PROMPT = ("Solve the task. Think it through, then give only your final answer inside <answer></answer>, "
                 "in the format the task asks for.")
DRAWS_PER_ROW = 3  # a split draws at most 3 * size + 30 items to find `size` distinct questions
DOC = """{env}: reasoning-gym's `{generator}` generator ({category}), answered in one turn.

{description}{pinned}

Task:
    The generator's question; reply with the final answer inside <answer></answer>.
Row schema:
    info = {{"generator": "{generator}", "config": the generator's config fields (JSON text, no seed or size),
    "question", "answer", "metadata": the generator's entry (metadata as JSON text)}}; interaction single_turn.
Reward:
    correct (weight 1): reasoning-gym's own score_answer(answer, entry) for the text of the last <answer> tag,
    in [0, 1] (partial credit where the generator gives it); 0 without the tag or when the scorer refuses it.
Arguments:
    configs {configs}; sizes {sizes} (test drops questions that train holds); TaskConfig.seed.
Version history:
    v1: first release (reasoning-gym {version}).
"""


@dataclass
class GeneratorConfig(TaskConfig):
    """A config of one generator: its config fields (JSON; seed and size come from the split)."""

    params: dict[str, Any] = field(default_factory=dict)


class ReasoningGymTask(TaskBuilder):
    """Base of every `rg_*` builder; `make_builder` fills GENERATOR and the class attributes."""

    GENERATOR: ClassVar[str]
    CLOCK: ClassVar[Clock | None] = None  # the pinned clock of a generator that reads the date (see the probe)
    VERIFIER = "hubgym.bridges.reasoning_gym_verifier"
    BUILDER_CONFIG_CLASS = GeneratorConfig
    ROWS_IN_RANDOM_ORDER = True  # each row from its own seed: a mixture need not shuffle them

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        cfg, params_json = self.config, _canonical(self.config.params)
        banned: frozenset[str] = frozenset()
        if split != "train" and "train" in cfg.sizes:  # no question of train in another split
            banned = self._train_questions(params_json)
        questions = []
        where = Where(self.ENV, cfg.name, split)
        for entry in iter_entries(self.GENERATOR, params_json, seed, size, banned, where, self.CLOCK):
            questions.append(entry["question"])
            yield task_from_entry(self.ENV, self.GENERATOR, cfg.params, entry, cfg.name, self.TAGS)
        if split == "train":  # the whole split was read: the test split of this build excludes these questions
            self._drawn_train = frozenset(questions)

    def _train_questions(self, params_json: str) -> frozenset[str]:
        """The train split's questions: kept from this build's train split, else drawn again."""
        drawn = getattr(self, "_drawn_train", None)
        if drawn is None:
            cfg = self.config
            entries = draw_entries(self.GENERATOR, params_json, split_seed(cfg.seed, "train"), cfg.sizes["train"],
                                   frozenset(), Where(self.ENV, cfg.name, "train"), self.CLOCK)
            drawn = frozenset(e["question"] for e in entries)
        return drawn


def task_from_entry(env: str, generator: str, params: dict[str, Any], entry: dict[str, Any],
                    difficulty: str | None = None, tags: tuple[str, ...] = ()) -> Task:
    """The task row of one generator entry (already checked by `checked_entry`)."""
    # config and metadata as JSON text: the info column stores floats to ~10 digits and not stably, so as
    # objects they would change on a round trip (and with them the row's id and what the scorer sees)
    info = {"generator": generator, "config": json.dumps(params, sort_keys=True), "question": entry["question"],
            "answer": entry["answer"], "metadata": json.dumps(entry["metadata"], sort_keys=True)}
    return make_task(env, [system(SYSTEM_PROMPT), user(entry["question"])], info, difficulty=difficulty,
                     tags=list(tags))


def draw_entries(generator: str, params_json: str, seed: int, size: int, banned: frozenset[str],
                 where: Where, clock: Clock | None = None) -> list[dict[str, Any]]:
    """Up to `size` checked entries with distinct questions, none of them in `banned`. Fewer when the
    generator's space is that small (deterministic all the same)."""
    return list(iter_entries(generator, params_json, seed, size, banned, where, clock))


def iter_entries(generator: str, params_json: str, seed: int, size: int, banned: frozenset[str],
                 where: Where, clock: Clock | None = None) -> Iterator[dict[str, Any]]:
    """`draw_entries` one at a time: a task mixture that draws a few rows of an env generates only those
    (a split of a slow generator takes minutes to generate whole). With `clock`, the generator sees that
    clock while it makes and scores each item (one that reads the date gives the same items on every day)."""
    import reasoning_gym

    params, banned = json.loads(params_json), set(banned)
    limit = DRAWS_PER_ROW * size + 30
    try:
        with at_clock(clock), prints_dropped():
            dataset = reasoning_gym.create_dataset(generator, **params, seed=seed, size=limit)
    except Exception as exc:
        raise EnvContractError(f"reasoning-gym's {generator!r} refused its config: {type(exc).__name__}: {exc}",
                               Where(where.env, where.config, where.split, field="params"),
                               "regenerate the index (python -m hubgym.bridges.reasoning_gym_probe) for the installed "
                               "reasoning-gym") from exc
    drawn = 0
    for index in range(limit):
        if drawn == size:
            return
        with at_clock(clock), prints_dropped():  # per item: the caller's code between items runs as usual
            entry = checked_entry(generator, params, dataset, index, where)
        if entry["question"] not in banned:
            banned.add(entry["question"])
            drawn += 1
            yield entry


def checked_entry(generator: str, params: dict[str, Any], dataset: Any, index: int, where: Where) -> dict[str, Any]:
    """Item `index` as a JSON entry, refused with one EnvContractError when the generator raises, its
    entry is not JSON, or its own scorer does not give its own answer full marks."""
    at = Where(where.env, where.config, where.split, f"{generator}[{index}]")
    fix = ("leave the generator or config out: add it to the probe's exclusions and rerun "
           "python -m hubgym.bridges.reasoning_gym_probe")
    try:
        item = dataset[index]
    except Exception as exc:
        raise EnvContractError(f"generator {generator!r} raised {type(exc).__name__}: {exc}",
                               _at(at, "question"), fix) from exc
    for name in ("question", "answer"):
        if not isinstance(item.get(name), str):
            raise EnvContractError(f"generator {generator!r} gave {name} {item.get(name)!r}, not a string",
                                   _at(at, name), fix)
    try:
        metadata = json.loads(json.dumps(item.get("metadata", {}), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise EnvContractError(f"generator {generator!r} gave metadata that is not JSON: {exc}",
                               _at(at, "metadata"), fix) from exc
    entry = {"question": item["question"], "answer": item["answer"], "metadata": metadata}
    reward = score_entry(generator, params, entry["answer"], entry)
    if reward != 1.0:
        raise EnvContractError(f"reasoning-gym's own score_answer gives generator {generator!r}'s answer "
                               f"{entry['answer'][:80]!r} {reward}, not 1.0"
                               " (scored on the entry as the row stores it, after JSON)",
                               _at(at, "answer"), fix)
    return entry


def _at(where: Where, field_name: str) -> Where:
    return Where(where.env, where.config, where.split, where.row, field_name)


def _canonical(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


# -- the family ------------------------------------------------------------------------------

EXCLUDED: dict[str, str] = load_specs()["excluded"]
"""Generators that are not envs, by reasoning-gym name, with why (found by probing; see reasoning_gym_probe)."""


def make_builder(env: str, spec: dict[str, Any], version: str,
                 left_out: dict[str, str] | None = None) -> type[ReasoningGymTask]:
    """The builder class of one env, from its spec (no import of reasoning_gym); `left_out`: config -> why the
    probe dropped it."""
    configs = [GeneratorConfig(name=name, params=params, sizes=_train_first(spec["sizes"][name]))
               for name, params in spec["configs"].items()]
    doc = DOC.format(env=env, generator=spec["generator"], category=spec["category"],
                     description=spec["description"], configs=", ".join(spec["configs"]), version=version,
                     sizes="; ".join(f"{n}: {_train_first(s)}" for n, s in spec["sizes"].items()),
                     pinned=f"\n\nThe generator reads the date; it runs at {Clock(**spec['clock'])} (pinned), so the "
                            f"rows are the same on every day." if spec.get("clock") else "")
    name = "".join(part.title() for part in env.split("_"))
    return type(name, (ReasoningGymTask,), {
        "__doc__": doc, "__module__": __name__, "ENV": env, "GENERATOR": spec["generator"],
        "CLOCK": Clock(**spec["clock"]) if spec.get("clock") else None,
        "GOLDEN": f"golden/{env}.jsonl", "TAGS": tuple(spec["tags"]), "BUILDER_CONFIGS": configs,
        "LEFT_OUT_CONFIGS": dict(left_out or {}),
    })


def _train_first(sizes: dict[str, int]) -> dict[str, int]:
    """Splits in build order, train first: the other splits then reuse its questions instead of drawing them."""
    return dict(sorted(sizes.items(), key=lambda item: item[0] != "train"))


class ReasoningGymFamily:
    """The `rg_` family (hubgym.builders.families.EnvFamily)."""

    name = "reasoning_gym"
    prefix = "rg_"

    def entries(self) -> list[FamilyEnv]:
        return load_index(INDEX, source=self.name)

    def builder(self, name: str) -> type[TaskBuilder]:
        return _builder(name)


@cache
def _builder(name: str) -> type[ReasoningGymTask]:
    specs = load_specs()
    if name not in specs["envs"]:
        generator = name.removeprefix(ReasoningGymFamily.prefix)
        if generator in specs["excluded"]:
            raise EnvNotFoundError(f"{name!r} is not bridged: reasoning-gym's {generator!r} "
                                   f"{specs['excluded'][generator]}")
        raise unknown_env(name, ReasoningGymFamily.name, sorted(specs["envs"]))
    return make_builder(name, specs["envs"][name], specs["version"], specs["dropped_configs"].get(name))


FAMILY = ReasoningGymFamily()
