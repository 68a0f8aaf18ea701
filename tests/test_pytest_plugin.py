"""The pytest plugin: `--hubgym-env` makes one test per check; the `hubgym_check` fixture checks an env in one test."""

import shutil
from pathlib import Path

import pytest

from hubgym.conformance import CHECKS, check_env

pytest_plugins = ["pytester"]

ENVS = Path(__file__).parent / "broken_envs"
N = len(CHECKS)


@pytest.fixture(scope="module", autouse=True)
def _modules_loaded_once():
    """pytester's in-process runs drop the modules they import; loading datasets' lazy parts here keeps them
    (and keeps hubgym's classes the same objects in both runs)."""
    check_env(str(ENVS / "baseline_mdp"), max_rows=1)


def _env(pytester, name: str, as_name: str | None = None) -> str:
    shutil.copytree(ENVS / name, pytester.path / (as_name or name))
    return as_name or name


@pytest.mark.slow
def test_one_passing_test_per_check_for_a_good_env(pytester):
    folder = _env(pytester, "baseline", "my_env")
    result = pytester.runpytest("--hubgym-env", folder, "-v")
    result.assert_outcomes(passed=N)
    result.stdout.fnmatch_lines([f"*collected {N} items", *(f"hubgym-check?my_env::{c.__name__}? PASSED*"
                                                           for c in CHECKS)])


@pytest.mark.slow
def test_a_broken_env_fails_exactly_its_check_with_the_message_and_no_traceback(pytester):
    folder = _env(pytester, "golden_disagrees")
    result = pytester.runpytest("--hubgym-env", folder)
    result.assert_outcomes(passed=N - 1, failed=1)
    result.stdout.fnmatch_lines([
        "*_ hubgym-check?golden_disagrees::check_golden_cases? _*",
        "check_golden_cases: golden case 'upper case counts' scored 0.0, but the golden file declares 1.0 *"
        "Fix: fix the verifier; or, if the new reward is intended, update the case and bump ENV_VERSION",
        "FAILED hubgym-check?golden_disagrees::check_golden_cases? - check_golden_*",
    ])
    assert "Traceback" not in result.stdout.str() and "hubgym/conformance" not in result.stdout.str()


@pytest.mark.slow
def test_keyword_selection_runs_a_later_check_alone(pytester):
    folder = _env(pytester, "unstable_ids")
    result = pytester.runpytest("--hubgym-env", folder, "-k", "check_ids_stable or check_golden_cases")
    result.assert_outcomes(passed=1, failed=1, deselected=N - 2)
    result.stdout.fnmatch_lines(["FAILED hubgym-check?unstable_ids::check_ids_stable? - check_ids_stable: *"])


@pytest.mark.slow
def test_two_envs_and_a_config_option(pytester):
    good, bad = _env(pytester, "baseline_mdp"), _env(pytester, "nondeterministic_step")
    result = pytester.runpytest("--hubgym-env", good, "--hubgym-env", bad, "--hubgym-config", "default",
                                "--hubgym-max-rows", "2")
    result.assert_outcomes(passed=2 * N - 2, failed=2)
    result.stdout.fnmatch_lines(["FAILED hubgym-check?nondeterministic_step::check_reset_step_deterministic?*",
                                 "FAILED hubgym-check?nondeterministic_step::check_golden_replay?*"])


@pytest.mark.slow
def test_the_fixture_passes_a_good_env_and_lists_every_failure_of_a_broken_one(pytester):
    _env(pytester, "baseline", "my_env")
    _env(pytester, "unstable_ids")
    pytester.makepyfile(test_envs="""
        def test_good(hubgym_check):
            results = hubgym_check("my_env")
            assert len(results) == %d and all(r.ok for r in results)

        def test_broken(hubgym_check):
            hubgym_check("unstable_ids", max_rows=5)
    """ % N)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "3 of %d hubgym checks failed for 'unstable_ids':" % N,
        "- check_ids_stable: ids differ between two builds of the same config and seed: *",
        "- check_ids_from_content: id 'unstable_ids-*' is not derived from the row's content *",
        "- check_deterministic_rows: row 0 differs between two builds *",
    ])


@pytest.mark.slow
def test_a_folder_of_envs_checks_each_env_folder_in_it(pytester):
    envs = pytester.path / "envs"
    shutil.copytree(ENVS / "baseline", envs / "my_env")
    shutil.copytree(ENVS / "nondeterministic_step", envs / "games" / "guess")
    (envs / "notes").mkdir()  # a folder without builder.py is not an env
    result = pytester.runpytest("--hubgym-env", "envs", "--hubgym-max-rows", "2")
    result.assert_outcomes(passed=2 * N - 2, failed=2)
    result.stdout.fnmatch_lines([f"*collected {2 * N} items",
                                 "FAILED hubgym-check?games/guess::check_reset_step_deterministic?*",
                                 "FAILED hubgym-check?games/guess::check_golden_replay?*"])


def test_a_folder_without_envs_is_a_usage_error(pytester):
    (pytester.path / "envs").mkdir()
    result = pytester.runpytest("--hubgym-env", "envs")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --hubgym-env envs: no folder at or below it holds builder.py; *"])
