"""The contributor path: `hubgym init --kind` makes a checked env of every kind, with tests that follow the env as it
is edited; `hubgym check` and `pytest --hubgym-env` take a folder of envs; `hubgym build` leaves only the built
files; `python -m hubgym` is the command."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.conformance import CHECKS

KINDS = ["single_turn", "tool_use", "multi_turn"]
FILES = ["README.md", "__init__.py", "builder.py", "golden.jsonl", "test_env.py", "verifier.py"]


def hubgym(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest as a contributor runs it, in their own folder (not this repository's configuration)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=folder,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_init_makes_an_env_of_each_kind_that_passes_check_and_its_own_tests(tmp_path):
    for kind in KINDS:
        made = hubgym("init", f"my_{kind}", "--kind", kind, "--dir", tmp_path)
        assert made.exit_code == 0, made.output
        folder = tmp_path / f"my_{kind}"
        assert sorted(p.name for p in folder.iterdir()) == sorted(FILES + ["tools.py"] * (kind == "tool_use"))
        assert f'KIND = "{kind}"' in (folder / "builder.py").read_text()
    # several envs side by side: their test_env.py files and one test per check of each env (then `hubgym check`
    # runs every check of all three once more, as a contributor would)
    tested = pytest_in(tmp_path, "--hubgym-env", ".")
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
    assert f"{3 * len(CHECKS) + 3 * 2} passed" in tested.stdout
    checked = hubgym("check", tmp_path)
    assert checked.exit_code == 0, checked.output
    assert f"all {3 * len(CHECKS)} checks passed" in checked.output


def test_the_multi_turn_example_shows_the_mdp_contract(tmp_path):
    folder = tmp_path / "guess"
    hubgym("init", "guess", "--kind", "multi_turn", "--dir", tmp_path)
    verifier = (folder / "verifier.py").read_text()
    assert "def reset(task: Task)" in verifier and "def step(task: Task, state: State, action: str)" in verifier
    golden = (folder / "golden.jsonl").read_text()
    assert golden.count('"interaction": {"kind": "multi_turn"') == golden.count("\n") and '"actions"' in golden


@pytest.mark.slow
def test_generated_tests_follow_the_env_as_it_is_edited(tmp_path):
    hubgym("init", "sums", "--dir", tmp_path)
    folder = tmp_path / "sums"
    # a consistent edit: the answer moves to another info key, the splits change size
    for name in ("builder.py", "verifier.py", "golden.jsonl"):
        path = folder / name
        path.write_text(path.read_text().replace('"answer"', '"total"').replace("'answer'", "'total'"))
    builder = folder / "builder.py"
    builder.write_text(builder.read_text().replace('sizes={"train": 200, "test": 50}', 'sizes={"train": 30, "dev": 5}'))
    tested = pytest_in(folder)
    assert tested.returncode == 0, tested.stdout[-3000:]
    assert "2 passed" in tested.stdout
    # a wrong edit: the golden file now disagrees with the verifier, and the tests say so
    golden = folder / "golden.jsonl"
    golden.write_text(golden.read_text().replace('"reward": 0.0}', '"reward": 0.5}', 1))
    tested = pytest_in(folder)
    assert tested.returncode == 1 and "1 failed, 1 passed" in tested.stdout
    assert "check_golden_cases: golden case 'wrong sum' scored 0.0, but the golden file declares 0.5" in tested.stdout


def test_init_refuses_an_unknown_kind(tmp_path):
    result = hubgym("init", "sums", "--kind", "dialogue", "--dir", tmp_path)
    assert result.exit_code == 2 and "'dialogue' is not one of" in re.sub(r"\s+", " ", result.output)
    assert not list(tmp_path.iterdir())


def test_a_folder_without_envs_is_one_clear_error(tmp_path):
    (tmp_path / "notes").mkdir()
    result = hubgym("check", tmp_path)
    assert result.exit_code == 1
    assert f"{tmp_path} holds no env: neither it nor any folder below it has builder.py" in re.sub(
        r"\s+", " ", result.output)


@pytest.mark.slow
def test_build_leaves_only_the_built_files_in_out(tmp_path):
    out = tmp_path / "out"
    result = hubgym("build", "arithmetic", "--config", "all", "--out", out)
    assert result.exit_code == 0, result.output
    left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    configs = ("easy", "hard", "medium", "sums", "tiny")
    assert left == sorted([*configs, *(f"{c}/{f}" for c in configs for f in (
        "arithmetic-test.parquet", "arithmetic-train.parquet", "dataset_info.json"))])  # no *.lock, no staging


@pytest.mark.slow
def test_python_dash_m_hubgym_is_the_command(tmp_path):
    shown = subprocess.run([sys.executable, "-m", "hubgym", "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "Usage: python -m hubgym" in shown.stdout
    for command in ("init", "check", "rollout", "train", "demo"):
        assert f" {command} " in shown.stdout
    made = subprocess.run([sys.executable, "-m", "hubgym", "init", "count_up", "--kind", "tool_use", "--dir",
                           tmp_path], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "count_up" / "builder.py").is_file()
