"""The reasoning-gym family: its index, builders, verifier, exclusions, and conformance of every env."""

from __future__ import annotations

import functools
import json
import time

import pytest

from hubgym.bridges import reasoning_gym as rg
from hubgym.bridges import reasoning_gym_probe as probe
from hubgym.envs.build import build_tasks
from hubgym.builders.families import load_index
from hubgym.conformance import check_env
from hubgym.conformance.checks import per_env_checks
from hubgym.errors import EnvContractError, EnvNotFoundError, Where
from hubgym.schemas import assistant
from hubgym.bridges import reasoning_gym_verifier as verifier
from hubgym.bridges.reasoning_gym_shipped import load_specs

REPRESENTATIVE = ["rg_basic_arithmetic", "rg_word_sorting", "rg_prime_factorization", "rg_game_of_life_halting"]
"""A plain one, one whose config fields are enums, one whose scorer raises on junk, one with partial credit."""


def failed(results) -> list[str]:
    """Failures only: a `sampled` class cannot be imported by a second process, so its hash-seed check is skipped
    (the probe samples every generator under two hash seeds instead)."""
    return [r.message for r in results if r.failed]


def test_entries_list_every_bridged_generator_without_importing_it():
    entries = rg.FAMILY.entries()
    names = [e.name for e in entries]
    assert len(names) == len(rg.load_specs()["envs"]) >= 90
    assert names == sorted(names) and all(n.startswith("rg_") for n in names)
    arithmetic = next(e for e in entries if e.name == "rg_basic_arithmetic")
    assert arithmetic.configs == ("default", "easy", "hard") and arithmetic.kind == "single_turn"
    assert not set(rg.EXCLUDED) & {n.removeprefix("rg_") for n in names}


def test_builder_is_cached_and_unknown_or_excluded_names_say_why():
    assert rg.FAMILY.builder("rg_basic_arithmetic") is rg.FAMILY.builder("rg_basic_arithmetic")
    with pytest.raises(EnvNotFoundError, match="did you mean rg_basic_arithmetic"):
        rg.FAMILY.builder("rg_basic_arithmetc")
    excluded = sorted(rg.EXCLUDED)[0]
    with pytest.raises(EnvNotFoundError, match="is not bridged"):
        rg.FAMILY.builder("rg_" + excluded)


def test_a_config_the_probe_left_out_says_why_wherever_it_is_asked_for():
    """`rg_bf:hard` hangs on some seeds, so the shipped specs drop it: asking for it names that reason, through the
    library's ENV:CONFIG, the CLI's --config and a mixture alike; a config nobody dropped gets the plain message."""
    from typer.testing import CliRunner

    from hubgym.cli import app
    from hubgym.envs.listing import listing
    from hubgym.envs.resolve import known_config
    from hubgym.mixture import expand, parse_spec

    why = load_specs()["dropped_configs"]["rg_bf"]["hard"]
    with pytest.raises(EnvContractError) as library:
        known_config(rg.FAMILY.builder("rg_bf"), "hard")
    cli = CliRunner().invoke(app, ["check", "rg_bf", "--config", "hard"])
    with pytest.raises(EnvContractError) as mixed:
        expand(parse_spec([{"name": "rg_bf:hard"}]), listing())
    for said in (str(library.value), " ".join(cli.output.split()), str(mixed.value)):
        assert f"env 'rg_bf' has no config 'hard' (left out: {why})" in said and "default, easy" in said, said
    with pytest.raises(EnvContractError) as plain:
        known_config(rg.FAMILY.builder("rg_bf"), "medium")
    assert "has no config 'medium' [" in str(plain.value)


@pytest.mark.slow
@pytest.mark.parametrize("env", REPRESENTATIVE)
def test_representative_envs_pass_conformance(env):
    assert failed(check_env(rg.FAMILY.builder(env), configs=["easy"], max_rows=20)) == []


@pytest.mark.slow
def test_rows_carry_the_entry_and_test_holds_no_train_question():
    tasks = build_tasks(rg.FAMILY.builder("rg_basic_arithmetic"), "easy")
    train, test = tasks["train"].to_list(), tasks["test"].to_list()
    assert len(test) == 100 and len(train) >= 100
    assert not {r["info"]["question"] for r in train} & {r["info"]["question"] for r in test}
    info = test[0]["info"]
    assert set(info) == {"generator", "config", "question", "answer", "metadata"}
    assert info["generator"] == "basic_arithmetic" and json.loads(info["config"]) == {"max_terms": 2, "max_digits": 1}
    assert json.loads(info["metadata"])["source_dataset"] == "basic_arithmetic"
    assert "<answer></answer>" in test[0]["prompt"][0]["content"]
    assert test[0]["prompt"][1]["content"] == info["question"]
    score = rg.FAMILY.builder("rg_basic_arithmetic").verifier().score
    assert score(test[0], [assistant(f"<answer>{info['answer']}</answer>")]).reward == 1.0
    assert score(test[0], [assistant("<answer>no idea</answer>")]).reward == 0.0
    assert score(test[0], [assistant(f"The answer is {info['answer']}")]).reward == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("env", REPRESENTATIVE)
def test_golden_cases_reward_the_generator_answer_fully_and_a_wrong_one_nothing(env):
    cases = {c.name: c for c in rg.FAMILY.builder(env).golden_cases()}
    score = rg.FAMILY.builder(env).verifier().score
    right, wrong = cases["the generator's answer to item 0"], cases["a wrong answer"]
    assert score(right.task, right.completion).reward == right.reward == 1.0
    assert score(wrong.task, wrong.completion).reward == wrong.reward == 0.0


def test_scorer_that_raises_on_an_answer_scores_it_zero():
    entry = {"question": "Find the prime factorization of 15.", "answer": "3 × 5", "metadata": {"number": 15}}
    assert verifier.score_entry("prime_factorization", {}, "3 × 5", entry) == 1.0
    assert verifier.score_entry("prime_factorization", {}, "zzqx", entry) == 0.0  # its int() parser raises


def test_bad_generator_output_is_one_error_naming_env_config_split_row_and_field():
    class AnswerlessDataset:
        def __getitem__(self, index):
            return {"question": "q", "answer": None, "metadata": {}}

    with pytest.raises(EnvContractError) as info:
        rg.checked_entry("boxnet", {}, AnswerlessDataset(), 4, Where("rg_boxnet", "easy", "test"))
    assert info.value.where == Where("rg_boxnet", "easy", "test", "boxnet[4]", "answer")

    class NonJsonDataset:
        def __getitem__(self, index):
            return {"question": "q", "answer": "a", "metadata": {"when": object()}}

    with pytest.raises(EnvContractError, match="metadata that is not JSON") as info:
        rg.checked_entry("ab", {}, NonJsonDataset(), 0, Where("rg_ab", "default", "train"))
    assert info.value.where.field == "metadata"


def test_what_a_generator_prints_stays_out_of_the_command_output(capfd, monkeypatch):
    """`bf` prints each program's output as it runs it; any generator may print while it is made or asked for an
    item. None of that is the row's, and none of it reaches stdout (a command's tables and JSON go there)."""
    entries = rg.draw_entries("bf", "{}", 7, 2, frozenset(), Where("rg_bf", "default", "train"))
    assert len(entries) == 2
    import reasoning_gym

    class PrintingDataset:
        def __getitem__(self, index):
            print(f"making item {index}")
            return {"question": f"q{index}", "answer": "a", "metadata": {}}

        def score_answer(self, answer, entry):
            print(f"scoring {answer!r}")
            return float(answer == entry["answer"])

    def create_dataset(name, **kwargs):
        print("made a dataset")
        return PrintingDataset()

    monkeypatch.setattr(reasoning_gym, "create_dataset", create_dataset)
    monkeypatch.setattr(verifier, "_scorer", functools.lru_cache(verifier._scorer.__wrapped__))  # a cache of its own
    entries = rg.draw_entries("ab", "{}", 0, 2, frozenset(), Where("rg_ab", "default", "train"))
    assert [e["question"] for e in entries] == ["q0", "q1"]
    assert verifier.score_entry("ab", {}, "b", entries[0]) == 0.0
    print("the caller's own line")
    assert capfd.readouterr().out == "the caller's own line\n"


EXCLUSION_SAMPLE = ["boxnet", "codeio", "composite", "graph_color", "list_functions"]


@pytest.mark.slow
@pytest.mark.parametrize("generator", EXCLUSION_SAMPLE)
def test_excluded_generators_fail_as_stated(generator):
    with pytest.raises(probe.ProbeFailure) as info:
        probe.probe_generator(generator)
    assert str(info.value) == rg.EXCLUDED[generator]


PROBED = {  # generators probed again by the tests, one of each path the probe takes (all of them: ~7 minutes)
    "time_intervals": "reads the clock (probed under a pinned one)",
    "caesar_cipher": "a config left out (dropped_configs)",
    "bf": "slow (SMALL sizes), a config too slow to keep (TOO_SLOW)",
    "base_conversion": "MEDIUM sizes",
    "basic_arithmetic": "plain",
    "boxnet": "excluded: no oracle answer",
    "composite": "excluded: not a generator",
    "gsm_symbolic": "excluded: metadata that is not JSON",
}


def test_the_shipped_specs_account_for_every_generator_of_the_installed_package():
    """Each generator of the installed reasoning-gym is an env or excluded with a reason; one golden file an env."""
    from importlib.metadata import version

    from reasoning_gym.factory import DATASETS

    specs = load_specs()
    assert specs["version"] == version("reasoning_gym")
    named = {env.removeprefix("rg_") for env in specs["envs"]} | set(specs["excluded"])
    assert named == set(DATASETS) and not {e.removeprefix("rg_") for e in specs["envs"]} & set(specs["excluded"])
    assert load_index(rg.INDEX, "reasoning_gym") == sorted(probe.family_entries(specs["envs"]), key=lambda e: e.name)
    assert sorted(p.stem for p in rg.GOLDEN_DIR.glob("rg_*.jsonl")) == sorted(specs["envs"])


@pytest.mark.slow
@pytest.mark.parametrize("generator", sorted(PROBED))
def test_probing_a_generator_again_gives_its_shipped_spec_and_golden_file(generator):
    """`python -m hubgym.bridges.reasoning_gym_probe` rewrites every shipped file; probing PROBED's generators again
    gives the same spec, dropped configs, exclusion and golden cases (a probe change or a package change shows)."""
    specs, env = load_specs(), probe.PREFIX + generator
    try:
        spec, dropped = probe.probe_generator(generator)
    except probe.ProbeFailure as exc:
        assert specs["excluded"].get(generator) == str(exc)
        return
    assert specs["envs"][env] == spec and specs["dropped_configs"].get(env, {}) == dropped
    assert (rg.GOLDEN_DIR / f"{env}.jsonl").read_text() == probe.golden_text(env, spec)


def sampled(env: str, sizes: dict[str, int]) -> type:
    """The env's builder with its default config only, at `sizes` (same checks, fewer rows to build)."""
    cls = rg.FAMILY.builder(env)
    default = cls.BUILDER_CONFIGS[0]
    config = rg.GeneratorConfig(name=default.name, params=default.params, seed=default.seed, sizes=sizes)
    attributes = {"BUILDER_CONFIGS": [config], "__module__": cls.__module__, "__doc__": cls.__doc__}
    return type(cls.__name__, (cls,), attributes)


@pytest.mark.slow
def test_every_bridged_env_passes_conformance():
    """Every env, sampled: its default config at 4 train / 2 test rows, every check on 2 rows a split (the full
    check of all configs at full size is `hubgym check --source reasoning_gym`); prints the time it took. Some
    generators are slow by design (futoshiki counts the solutions of each puzzle: about 1 s a row). The checks
    of the scoring process (other processes, fresh imports, thousands of calls) test the family's one verifier
    module: they run on the REPRESENTATIVE envs above, not on each of 90."""
    start, failures = time.perf_counter(), {}
    for entry in rg.FAMILY.entries():
        messages = failed(check_env(sampled(entry.name, {"train": 4, "test": 2}), max_rows=2, checks=per_env_checks()))
        if messages:
            failures[entry.name] = messages[0]
    print(f"conformance of {len(rg.FAMILY.entries())} rg envs: {time.perf_counter() - start:.0f} s")
    assert failures == {}, json.dumps(failures, indent=1)


@pytest.mark.slow
def test_a_generator_that_reads_the_date_is_pinned_to_one_clock_and_passes_the_clock_checks():
    """reasoning-gym's time_intervals calls date.today(): the probe finds it (and only such generators) and pins its
    clock, so its rows are the same on any day; the checker builds it under two clocks and time zones to prove it."""
    specs = rg.load_specs()["envs"]
    assert {env for env, spec in specs.items() if "clock" in spec} == {"rg_time_intervals"}
    assert specs["rg_time_intervals"]["clock"] == {"moment": "2025-01-01T12:00:00", "zone": "UTC"}
    assert probe.follows_clock("time_intervals") and not probe.follows_clock("basic_arithmetic")
    assert failed(check_env(sampled("rg_time_intervals", {"train": 40, "test": 10}), max_rows=5)) == []
    metadata = [json.loads(case["task"]["info"]["metadata"]) for case in map(json.loads, (
        rg.GOLDEN_DIR / "rg_time_intervals.jsonl").read_text().splitlines())]
    assert {m["start_time"][:10] for m in metadata if m["task_type"].startswith("time")} == {"2025-01-01"}


def test_every_catalog_description_names_its_own_generator():
    """A docstring copied from another generator (number_format's reads "Generates Count Bits exercises") is not a
    description: the env is then described by its own generator's name."""
    entries = {e.name: e for e in rg.FAMILY.entries()}
    assert entries["rg_number_format"].description == "reasoning-gym's number_format generator"
    assert entries["rg_string_manipulation"].description == "reasoning-gym's string_manipulation generator"
    assert entries["rg_count_bits"].description.startswith("Generates Count Bits")
    assert probe.describe(type("Copied", (), {"__doc__": "Generates Count Bits exercises"}), "products") == \
        "reasoning-gym's products generator"


@pytest.mark.slow
def test_a_generator_that_follows_the_hash_seed_is_excluded_as_stated():
    assert probe.hash_seed_sensitive(["isomorphic_strings", "basic_arithmetic"]) == ["isomorphic_strings"]
    assert rg.EXCLUDED["isomorphic_strings"] == probe.HASH_SEED_REASON


def test_a_mixture_drawing_one_task_of_a_family_env_generates_one_item_not_its_split(monkeypatch):
    """Opening a slow generator's env must not generate its whole split (nor a shuffle block): a batch over all of
    the family's configs would take hours."""
    import hubgym.bridges.reasoning_gym as bridge
    from hubgym.mixture import Mixture, parse_spec

    generated = []
    real = bridge.checked_entry

    def counting(generator, params, dataset, index, where):
        generated.append(index)
        return real(generator, params, dataset, index, where)

    monkeypatch.setattr(bridge, "checked_entry", counting)
    mixture = Mixture.from_spec(parse_spec([{"name": "rg_basic_arithmetic:default"}]), split="train", seed=0)
    drawn = mixture.take(1)
    assert len(drawn) == 1 and drawn[0].task["env"] == "rg_basic_arithmetic"
    assert generated == [0]


@pytest.mark.parametrize("change, field", [
    ({"generator": "no_such_generator"}, "info.generator"),
    ({"generator": "sudoku"}, "does not belong to env"),
    ({"config": '{"max_terms": 1000000, "min_terms": 999999}'}, "info.config"),
])
def test_a_stored_row_cannot_choose_another_generator_or_config(change, field):
    """Stored rows are untrusted: the scorer is built only for a generator and config the bridge ships."""
    builder = rg.FAMILY.builder("rg_basic_arithmetic")
    task = builder.golden_cases()[0].task
    task = {**task, "env": "rg_basic_arithmetic", "info": {**task["info"], **change}}
    score = builder.verifier().score(task, [assistant("<answer>7</answer>")])
    assert score.reward is None and field in score.error["message"]
