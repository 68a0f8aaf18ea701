"""Probe the installed reasoning-gym: which generators and configs become `rg_*` envs, and their golden cases.

    from hubgym.bridges.reasoning_gym_probe import probe_all
    envs, excluded, dropped = probe_all()       # ~2 minutes: every generator and config is sampled
    excluded["codeio"]                          # 'nondeterministic: ...'

A generator is bridged when its default config, rebuilt from JSON, yields items that are the same for the same
seed, are JSON, and whose answer its own scorer gives 1.0 (sampled: PROBE_ITEMS items). Otherwise it is
EXCLUDED with the reason. Items are drawn under two fake clocks in two time zones (CHECK_CLOCKS): a generator
whose items follow the clock (and only the clock) is pinned to PINNED_CLOCK, recorded as its spec's `clock`,
so its rows are the same on every day; one whose items change otherwise is excluded as nondeterministic.
`easy` and `hard` (curriculum levels 0 and top, upper-bound ranges) are added where the generator has a
curriculum and pass the same probe; otherwise they are dropped with the reason.

Config fields are stored as the difference from the generator's defaults: smaller rows, and fields whose
defaults are not JSON (enums, nested dataclasses, datetime.time) stay out of the row unless a level sets them.

Split sizes come from measured generation cost (seconds per item on a 2-core machine, reasoning-gym 0.1.25),
written down here rather than timed at probe time, so the index is the same on every machine.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from hubgym.builders.clock import CHECK_CLOCKS, PINNED_CLOCK, Clock, at_clock
from hubgym.builders.families import FamilyEnv, write_index
from hubgym.errors import EnvContractError, Where
from hubgym.files import atomic_write_bytes
from hubgym.bridges.reasoning_gym import checked_entry, draw_entries, task_from_entry

PREFIX = "rg_"
PROBE_SEED, PROBE_ITEMS = 1234, 3
DEEP_PROBE = {"codeio": 30, "list_functions": 200}  # items whose nondeterminism a 3-item sample misses
GOLDEN_SEED, GOLDEN_ITEMS = 99, 2
WRONG_ANSWERS = ("-987654321", "no idea", "", "zzqx")  # the golden "wrong answer" is the first scored 0.0
SIZES = {"train": 1000, "test": 100}
MEDIUM_SIZES = {"train": 200, "test": 50}  # 5-50 ms per item in some config
SMALL_SIZES = {"train": 50, "test": 10}  # 50-500 ms per item in some config
MEDIUM = frozenset({
    "advanced_geometry", "arc_agi", "base_conversion", "binary_matrix", "countdown", "figlet_font", "game_of_life",
    "game_of_life_halting", "jugs", "mahjong_puzzle", "manipulate_matrix", "maze", "n_queens", "number_sorting",
    "polynomial_equations", "pool_matrix", "quantum_lock", "rearc", "rotate_matrix", "rotten_oranges",
    "shortest_path", "simple_integration", "spell_backward", "spiral_matrix", "string_splitting",
    "string_synthesis", "sudoku",
})
SMALL = frozenset({
    "bf", "circuit_logic", "futoshiki", "group_anagrams", "intermediate_integration", "kakurasu", "knight_swap",
    "polynomial_multiplication", "puzzle24", "sokoban", "word_ladder", "zebra_puzzles",
})
SLOW = "too slow: over 0.5 s per item (or over 20 s for 3 items)"
TOO_SLOW = {  # (generator, config) -> why it is left out; measured, not timed at probe time
    **{key: SLOW for key in [("futoshiki", "hard"), ("game_of_life", "hard"), ("jugs", "hard"), ("n_queens", "hard"),
                             ("puzzle24", "hard"), ("sokoban", "easy"), ("sokoban", "hard"), ("sudoku", "hard"),
                             ("zebra_puzzles", "hard")]},
    ("number_sequence", "hard"): "hangs: some seeds spend minutes on one item (terms grow to huge integers)",
    ("bf", "hard"): "hangs: some seeds spend minutes on one item (a long program run by a Python interpreter)",
}
NOT_GENERATORS = {"composite": "not a generator: it mixes other generators, each bridged on its own"}


class ProbeFailure(Exception):
    """Why a generator or config is not bridged (the message is the reason shipped in EXCLUDED)."""


def probe_all() -> tuple[dict[str, Any], dict[str, str], dict[str, dict[str, str]]]:
    """({env: spec}, {generator: reason excluded}, {env: {config: reason dropped}}) for every generator."""
    from reasoning_gym.factory import DATASETS

    envs, excluded, dropped = {}, {}, {}
    for generator in sorted(DATASETS):
        try:
            spec, not_kept = probe_generator(generator)
        except ProbeFailure as exc:
            excluded[generator] = str(exc)
            continue
        envs[PREFIX + generator] = spec
        if not_kept:
            dropped[PREFIX + generator] = not_kept
    for generator in hash_seed_sensitive([spec["generator"] for spec in envs.values()]):
        del envs[PREFIX + generator]
        dropped.pop(PREFIX + generator, None)
        excluded[generator] = HASH_SEED_REASON
    return envs, dict(sorted(excluded.items())), dropped


HASH_SEED_REASON = ("nondeterministic across processes: the same seed gives other items under another "
                    "PYTHONHASHSEED (it iterates over a set or hashes strings)")
MARK = "HUBGYM-PROBE-RESULT "


def hash_seed_sensitive(generators: list[str]) -> list[str]:
    """Generators whose default-config items change with Python's per-process hash seed: sampled in two
    subprocesses (PYTHONHASHSEED 1 and 2), since builds in one process always agree with each other."""
    samples = []
    for hash_seed in ("1", "2"):
        command = [sys.executable, "-m", "hubgym.bridges.reasoning_gym_probe", "--sample", *generators]
        done = subprocess.run(command,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed}, capture_output=True, text=True,
                              check=True)
        samples.append(json.loads(done.stdout.rsplit(MARK, 1)[1]))  # generators print to stdout too
    return [g for g in generators if samples[0][g] != samples[1][g]]


def sample_items(generator: str, clock: Clock = PINNED_CLOCK) -> str:
    """The first items (20; 5 of a slow generator) of the default config at the probe seed, as text, under
    `clock` (the hash-seed probe: the same in both processes, so only the hash seed differs)."""
    import reasoning_gym

    items = 5 if generator in SMALL else 20
    with at_clock(clock):
        dataset = reasoning_gym.create_dataset(generator, seed=PROBE_SEED, size=items)
        return json.dumps([dataset[i] for i in range(items)], sort_keys=True, default=repr)


def follows_clock(generator: str) -> bool:
    """Whether the default config's first items (as many as `sample_items` draws: more than probe_config's, so
    an item kind that reads the date shows) change between the two CHECK_CLOCKS, and only with the clock."""
    first, second = (sample_items(generator, clock) for clock in CHECK_CLOCKS)
    if first == second:
        return False
    if sample_items(generator, CHECK_CLOCKS[0]) != first:
        raise ProbeFailure("nondeterministic: two generators with the same seed gave different items "
                           "(it draws from an unseeded random source)")
    return True


def probe_generator(generator: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The env spec of one generator and the configs left out (with why); ProbeFailure when it is excluded."""
    from reasoning_gym.factory import DATASETS

    if generator in NOT_GENERATORS:
        raise ProbeFailure(NOT_GENERATORS[generator])
    dataset_cls, _ = DATASETS[generator]
    configs, dropped, clock = {}, {}, None
    for name, params in candidate_configs(generator).items():
        try:
            if (generator, name) in TOO_SLOW:
                raise ProbeFailure(TOO_SLOW[generator, name])
            configs[name], reads_clock = probe_config(generator, name, params)
            clock = PINNED_CLOCK if reads_clock else clock
        except ProbeFailure as exc:
            if name == "default":
                raise
            dropped[name] = str(exc)
    if clock is None and follows_clock(generator):
        clock = PINNED_CLOCK
    sizes = SMALL_SIZES if generator in SMALL else MEDIUM_SIZES if generator in MEDIUM else SIZES
    category = dataset_cls.__module__.split(".")[1]
    spec = {"generator": generator, "category": category, "description": describe(dataset_cls, generator),
            "tags": [category.lower(), "procedural"], "configs": configs,
            "sizes": {name: dict(sizes) for name in configs}}
    if clock is not None:
        spec["clock"] = dataclasses.asdict(clock)
    try:  # the golden items are more items of the default config: they must pass the same checks
        golden_cases(PREFIX + generator, spec)
    except EnvContractError as exc:
        raise ProbeFailure(_reason(exc)) from None
    return spec, dropped


def candidate_configs(generator: str) -> dict[str, dict[str, Any] | Exception]:
    """{config name: fields that differ from the defaults} (an exception when the curriculum cannot make one)."""
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
    from reasoning_gym.factory import CURRICULA, DATASETS, create_curriculum

    defaults = _fields(DATASETS[generator][1]())
    out: dict[str, dict[str, Any] | Exception] = {"default": {}}
    if generator not in CURRICULA:
        return out
    context = DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND)
    top = max((len(a.levels) for a in create_curriculum(generator).attributes.values()), default=1) - 1
    for name, level in (("easy", 0), ("hard", top)):
        curriculum = create_curriculum(generator)
        curriculum.set_global_level(level)
        try:
            fields = _fields(curriculum.generate_configuration(defaults={"seed": 0, "size": 1}, context=context))
        except Exception as exc:
            out[name] = exc
            continue
        out[name] = {k: v for k, v in fields.items() if v != defaults.get(k)}
    return out


def _fields(config: Any) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in ("seed", "size")}


def probe_config(generator: str, name: str, params: dict[str, Any] | Exception) -> tuple[dict[str, Any], bool]:
    """(the config's fields as JSON, whether its items follow the clock) when its items pass the probe under the
    two CHECK_CLOCKS, or under PINNED_CLOCK when they follow the clock; else ProbeFailure with the reason."""
    if isinstance(params, Exception):
        raise ProbeFailure(f"raises: the curriculum cannot make this level: {_error(params)}")
    try:
        as_json = json.loads(json.dumps(params, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ProbeFailure(f"non-JSON config: {exc}") from None
    where = Where(PREFIX + generator, name, "probe")
    first, second = (_probe_round(generator, as_json, where, clock) for clock in CHECK_CLOCKS)
    if first == second:
        return as_json, False
    if _probe_round(generator, as_json, where, CHECK_CLOCKS[0]) == first:  # the clock alone moved it: pin it
        if _probe_round(generator, as_json, where, PINNED_CLOCK) == _probe_round(generator, as_json, where,
                                                                                  PINNED_CLOCK):
            return as_json, True
    raise ProbeFailure("nondeterministic: two generators with the same seed gave different items "
                       "(it draws from an unseeded random source)")


def _probe_round(generator: str, params: dict[str, Any], where: Where, clock: Clock) -> str:
    """The probe's items of one config under `clock`, as JSON text; ProbeFailure when an item is refused."""
    import reasoning_gym

    items = DEEP_PROBE.get(generator, PROBE_ITEMS)
    try:
        with at_clock(clock):
            dataset = reasoning_gym.create_dataset(generator, **params, seed=PROBE_SEED, size=items)
            return json.dumps([checked_entry(generator, params, dataset, i, where) for i in range(items)],
                              sort_keys=True)
    except EnvContractError as exc:
        raise ProbeFailure(_reason(exc)) from None
    except Exception as exc:
        raise ProbeFailure(f"raises: {_error(exc)}") from None


def _reason(exc: EnvContractError) -> str:
    """The shipped reason for an item the bridge refuses (checked_entry's error), by the field at fault."""
    kind = {"question": "raises", "metadata": "non-JSON metadata"}.get(exc.where.field, "")
    if exc.where.field == "answer":
        kind = "no oracle answer" if "not a string" in exc.what else "scorer rejects its own answer"
    return f"{kind}: {exc.what}"


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def describe(dataset_cls: type, generator: str) -> str:
    """The first line of the generator class's own docstring (not an inherited one), unless its subject is another
    generator's name (a docstring copied from another class: number_format's says "Generates Count Bits ...")."""
    from reasoning_gym.factory import DATASETS

    doc = inspect.cleandoc(dataset_cls.__dict__.get("__doc__") or "")
    line = doc.splitlines()[0].strip().rstrip(".") if doc else ""
    subject = re.match(r"Generates ((?:[A-Z][A-Za-z0-9]*\s?)+)", line)
    named = "_".join(subject.group(1).lower().split()) if subject else None
    if not line or (named in DATASETS and named != generator):
        return f"reasoning-gym's {generator} generator"
    return line


# -- golden cases ----------------------------------------------------------------------------

def golden_cases(env: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Golden cases from the generator's own answers (1.0), a wrong answer (the scorer's value, 0.0 where one
    of WRONG_ANSWERS gets it), and a right answer without the tag (0.0), on the default config."""
    from hubgym.bridges.reasoning_gym_verifier import score_entry

    generator, params = spec["generator"], spec["configs"]["default"]
    where = Where(env, "default", "golden")
    clock = Clock(**spec["clock"]) if spec.get("clock") else None
    entries = draw_entries(generator, json.dumps(params, sort_keys=True), GOLDEN_SEED, GOLDEN_ITEMS, frozenset(), where,
                           clock)
    rows = [task_from_entry(env, generator, params, entry) for entry in entries]
    tasks = [{"prompt": row["prompt"], "info": row["info"]} for row in rows]
    cases = [_case(f"the generator's answer to item {i}", task, f"<answer>{task['info']['answer']}</answer>", 1.0)
             for i, task in enumerate(tasks)]
    first = entries[0]
    with at_clock(clock):
        scored = [(score_entry(generator, params, wrong, first), wrong) for wrong in WRONG_ANSWERS
                  if wrong != first["answer"]]
    reward, wrong = next(((r, w) for r, w in scored if r == 0.0), min(scored))
    cases.append(_case("a wrong answer", tasks[0], f"<answer>{wrong}</answer>", reward))
    cases.append(_case("the right answer without the tag", tasks[0], f"The answer is {first['answer']}", 0.0))
    return cases


def _case(name: str, task: dict[str, Any], reply: str, reward: float) -> dict[str, Any]:
    return {"name": name, "task": task, "completion": [{"role": "assistant", "content": reply}], "reward": reward}


# -- writing ---------------------------------------------------------------------------------

def family_entries(envs: dict[str, Any]) -> list[FamilyEnv]:
    return [FamilyEnv(name=env, kind="single_turn", configs=tuple(spec["configs"]), tags=tuple(spec["tags"]),
                      source="reasoning_gym", description=spec["description"]) for env, spec in envs.items()]


def specs_text(envs: dict[str, Any], excluded: dict[str, str], dropped: dict[str, dict[str, str]]) -> str:
    from importlib.metadata import version

    specs = {"version": version("reasoning_gym"), "envs": envs, "excluded": excluded, "dropped_configs": dropped}
    return json.dumps(specs, indent=1, sort_keys=True) + "\n"


def golden_text(env: str, spec: dict[str, Any]) -> str:
    return "".join(json.dumps(case, sort_keys=True) + "\n" for case in golden_cases(env, spec))


def write_all(index: Path, specs: Path, golden_dir: Path) -> None:
    """Probe, then write the index, the specs and one golden file per env (stale golden files removed)."""
    envs, excluded, dropped = probe_all()
    golden_dir.mkdir(exist_ok=True)
    for env, spec in envs.items():
        atomic_write_bytes(golden_dir / f"{env}.jsonl", golden_text(env, spec).encode())
    for stale in golden_dir.glob(f"{PREFIX}*.jsonl"):
        if stale.stem not in envs:
            stale.unlink()
    atomic_write_bytes(specs, specs_text(envs, excluded, dropped).encode())
    write_index(index, family_entries(envs))


def main(argv: list[str]) -> None:
    """`python -m hubgym.bridges.reasoning_gym_probe`: probe the installed reasoning-gym and rewrite the shipped
    index, specs and golden files. With `--sample GENERATOR...`: the second process of hash_seed_sensitive."""
    if argv[:1] == ["--sample"]:
        print("\n" + MARK + json.dumps({generator: sample_items(generator) for generator in argv[1:]}))
        return
    from hubgym.bridges.reasoning_gym_shipped import GOLDEN_DIR, INDEX, SPECS

    write_all(INDEX, SPECS, GOLDEN_DIR)


if __name__ == "__main__":
    main(sys.argv[1:])
