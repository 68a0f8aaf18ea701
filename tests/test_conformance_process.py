"""The checks that rewards and steps follow the task, not the process: variants of the broken envs pinned in
test_conformance_broken.py (numpy's generator, a variable read at call time, a step that drifts), the shared-splits
declaration, and the helpers the checks stand on."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from hubgym.conformance.checks import check_scoring_deterministic
from hubgym.conformance.common import generator_moved, global_random_state
from hubgym.conformance.process import (LONG_RUN_PERIOD, check_scoring_independent_of_environment,
                                        check_scoring_leaves_global_random_alone, check_scoring_stable_over_many_calls,
                                        variables_read)
from hubgym.conformance.runner import iter_outcomes
from hubgym.conformance.splits import check_held_out_apart

ENVS = Path(__file__).parent / "broken_envs"


def _copy(name: str, tmp_path: Path, rename: str | None = None) -> Path:
    folder = Path(shutil.copytree(ENVS / name, tmp_path / (rename or name)))
    if rename:
        builder = folder / "builder.py"
        builder.write_text(builder.read_text().replace(f'ENV = "{name}"', f'ENV = "{rename}"'))
    return folder


def _failure(folder: Path, *checks) -> str:
    """The message of the last of `checks` (run in order on one context), '' when it passes."""
    outcomes = list(iter_outcomes(str(folder), checks=list(checks)))
    return outcomes[-1][0].message


def test_a_draw_from_numpys_global_generator_is_named(tmp_path):
    folder = _copy("reward_draws_global_random", tmp_path)
    verifier = folder / "verifier.py"
    verifier.write_text(verifier.read_text().replace("import random\n", "import numpy\n")
                        .replace("random.random()", "numpy.random.random()"))
    message = _failure(folder, check_scoring_leaves_global_random_alone)
    assert message.startswith("check_scoring_leaves_global_random_alone: scoring the empty reply drew from the "
                              "process's global numpy.random generator (numpy.random's state moved while the verifier "
                              "ran)")


def test_the_envs_that_draw_from_their_own_generators_pass(tmp_path):
    """A generator of the row's own (seeded from the task) is fine; so is the untouched baseline."""
    folder = _copy("reward_draws_global_random", tmp_path)
    verifier = folder / "verifier.py"
    verifier.write_text(verifier.read_text().replace("random.random()",
                                                     "random.Random(task['info']['word']).random()"))
    assert _failure(folder, check_scoring_leaves_global_random_alone) == ""
    assert _failure(ENVS / "baseline", check_scoring_leaves_global_random_alone) == ""


def test_a_variable_read_while_scoring_is_found_too(tmp_path):
    """Read inside the reward at every call (not at import), a setting still shows, named with how it changed."""
    folder = _copy("reward_reads_environment", tmp_path)
    verifier = folder / "verifier.py"
    source = verifier.read_text().replace(
        'return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])',
        'right = extract_tag(final_text(completion), "answer") == task["info"]["word"]\n'
        '    return float(right and os.getenv("ECHO_STRICT") != "1")')
    verifier.write_text(source.replace('float(os.environ.get("ECHO_REWARD_WEIGHT", "1"))', "1.0"))
    message = _failure(folder, check_scoring_deterministic, check_scoring_independent_of_environment)
    assert "gave reward 1.0 {'correct': 1.0}, then reward 0.0 {'correct': 0.0} once" in message
    assert "(ECHO_STRICT: unset, then '1')" in message
    assert os.environ.get("ECHO_STRICT") is None  # restored


def test_a_step_that_drifts_after_thousands_of_steps_fails_the_long_run_check(tmp_path):
    """A multi_turn env whose step stops rewarding after 2,500 calls: the golden episode, scored again every
    LONG_RUN_PERIOD calls, earns nothing once the counter passes."""
    folder = _copy("baseline_mdp", tmp_path, rename="step_drifts")
    verifier = folder / "verifier.py"
    source = verifier.read_text().replace("import re\n", "import itertools\nimport re\n\nSTEPS = itertools.count()\n")
    counted = '    guesses = state["guesses"] + 1\n    fresh = next(STEPS) < 2_500  # every step counts\n'
    source = source.replace('    guesses = state["guesses"] + 1\n', counted)
    verifier.write_text(source.replace('return {"guesses": guesses}, "Correct!", 1.0, True',
                                       'return {"guesses": guesses}, "Correct!", float(fresh), True'))
    message = _failure(folder, check_scoring_deterministic, check_scoring_stable_over_many_calls)
    assert message.startswith(
        "check_scoring_stable_over_many_calls: scoring golden case 'binary search finds it' gave reward 1.0 "
        "{'steps': 1.0} on a freshly imported verifier, then reward 0.0 {'steps': 0.0} after ")
    calls = int(message.split(" after ")[1].split(" calls")[0].replace(",", ""))
    assert calls % LONG_RUN_PERIOD == 0 and 1_000 <= calls <= 3_000


def test_a_config_that_shares_its_splits_on_purpose_is_not_held_to_it(tmp_path):
    folder = _copy("test_shares_train_tasks", tmp_path)
    assert _failure(folder, check_held_out_apart).startswith("check_held_out_apart: 5 of the 10 tasks")
    declared = _copy("test_shares_train_tasks", tmp_path, rename="shares_on_purpose")  # a module of its own
    builder = declared / "builder.py"
    shared = '    SHARED_SPLITS = {"default": "a demo of fitting"}\n    VERIFIER = "verifier.py"'
    builder.write_text(builder.read_text().replace('    VERIFIER = "verifier.py"', shared))
    assert _failure(declared, check_held_out_apart) == ""


def test_variables_read_sees_getenv_and_environ_reads_and_restores_os_environ():
    kind = type(os.environ)
    with variables_read() as keys:
        os.getenv("HUBGYM_TEST_A")
        _ = "HUBGYM_TEST_B" in os.environ
        from os import environ

        environ.get("HUBGYM_TEST_C")
    assert keys == ["HUBGYM_TEST_A", "HUBGYM_TEST_B", "HUBGYM_TEST_C"] and type(os.environ) is kind


@pytest.mark.parametrize("draw, moved", [(lambda: random.random(), "random"), (lambda: None, None),
                                         (lambda: random.Random(3).random(), None)])
def test_generator_moved_names_the_global_generator_that_moved(draw, moved):
    numpy = pytest.importorskip("numpy")
    before = global_random_state()
    draw()
    assert generator_moved(before, global_random_state()) == moved
    before = global_random_state()
    numpy.random.random()
    assert generator_moved(before, global_random_state()) == "numpy.random"
