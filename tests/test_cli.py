"""The `hubgym` command, run for real: CliRunner on the typer app, plus the installed console script."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import datasets
import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.conformance import CHECKS

runner = CliRunner()


def hubgym(*args: str):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def one_line(text: str) -> str:
    """Output with rich's line wrapping undone, so a long message can be matched whole."""
    return re.sub(r"\s+", " ", text)


def test_envs_lists_builtins_without_building(tmp_path):
    result = hubgym("envs", "--source", "builtin")
    assert result.exit_code == 0
    row = next(line for line in result.output.splitlines() if line.strip().startswith("arithmetic"))
    assert row.split()[:7] == ["arithmetic", "single_turn", "builtin", "easy,", "medium,", "hard", "+2"]
    assert "math, arithmetic, procedural" in row
    assert "rg_" not in result.output and "7 builtin" in result.output


def test_build_writes_parquet_that_datasets_loads(tmp_path):
    result = hubgym("build", "arithmetic", "--config", "easy", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    folder = tmp_path / "out" / "easy"
    files = {split: str(folder / f"arithmetic-{split}.parquet") for split in ("train", "test")}
    loaded = datasets.load_dataset("parquet", data_files=files, cache_dir=str(tmp_path / "cache"))
    assert {split: len(ds) for split, ds in loaded.items()} == {"train": 150, "test": 30}
    assert set(loaded["test"]["env"]) == {"arithmetic"} and set(loaded["test"]["split"]) == {"test"}
    table = {line.split()[1]: line.split()[2] for line in result.output.splitlines() if " easy " in f" {line} "}
    assert table == {"train": "150", "test": "30"}


@pytest.mark.slow
def test_build_all_configs_as_arrow(tmp_path):
    result = hubgym("build", "arithmetic", "--config", "all", "--format", "arrow", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    built = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("*/*.arrow"))
    assert built == [f"{c}/arithmetic-{s}.arrow"
                     for c in ("easy", "hard", "medium", "sums", "tiny") for s in ("test", "train")]
    medium = datasets.Dataset.from_file(str(tmp_path / "medium" / "arithmetic-train.arrow"))
    assert len(medium) == 1000 and "10 files written" in result.output


def test_build_unknown_config_names_the_known_ones(tmp_path):
    result = hubgym("build", "arithmetic", "--config", "huge", "--out", tmp_path)
    assert result.exit_code == 1
    assert "env 'arithmetic' has no config 'huge'" in one_line(result.output)
    assert "one of: easy, medium, hard, tiny, sums (or 'all')" in one_line(result.output)
    assert not list(tmp_path.iterdir())


def test_builder_error_is_shown_without_traceback(tmp_path):
    folder = tmp_path / "twice"
    folder.mkdir()
    (folder / "builder.py").write_text(textwrap.dedent("""
        from hubgym import TaskBuilder, TaskConfig, make_task, user

        class Twice(TaskBuilder):
            ENV, VERIFIER, GOLDEN = "twice", "verifier.py", "golden.jsonl"
            BUILDER_CONFIGS = [TaskConfig(name="default", sizes={"train": 2})]

            def generate_tasks(self, split, size, seed):
                for _ in range(size):
                    yield make_task(self.ENV, [user("same")], {"answer": "1"})
    """))
    result = hubgym("build", folder, "--out", tmp_path / "out")
    assert result.exit_code == 1
    message = one_line(result.output)
    assert "error: task id 'twice-" in message and "was generated twice" in message and "split='train'" in message
    assert "Traceback" not in result.output


def test_unknown_env_lists_known_envs():
    result = hubgym("check", "nope")
    assert result.exit_code == 1
    assert "no environment named 'nope'; known: arithmetic, gsm8k" in one_line(result.output)
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_check_arithmetic_passes(tmp_path):
    result = hubgym("check", "arithmetic", "--config", "easy", "--max-rows", "20")
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.output and re.search(r"all \d+ checks passed", result.output)
    assert "check_golden_cases" in result.output


@pytest.mark.slow
def test_init_scaffolds_an_env_that_passes_check(tmp_path):
    result = hubgym("init", "add_numbers", "--dir", tmp_path)
    assert result.exit_code == 0, result.output
    folder = tmp_path / "add_numbers"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "__init__.py", "builder.py", "golden.jsonl",
                                                         "test_env.py", "verifier.py"]
    assert 'ENV = "add_numbers"' in (folder / "builder.py").read_text()
    checked = hubgym("check", folder)
    assert checked.exit_code == 0, checked.output
    assert re.search(r"all \d+ checks passed", checked.output)


@pytest.mark.slow
def test_check_prints_each_failure_in_full(tmp_path):
    hubgym("init", "sums", "--dir", tmp_path)
    golden = tmp_path / "sums" / "golden.jsonl"
    golden.write_text(golden.read_text().replace('"reward": 0.0}', '"reward": 0.5}', 1))
    result = hubgym("check", tmp_path / "sums")
    assert result.exit_code == 1
    message = one_line(result.output)
    assert "FAIL sums / check_golden_cases" in message and "golden case 'wrong sum'" in message
    assert re.search(r"error: [1-9]\d* of \d+ checks failed", message)


def test_check_reports_a_builder_that_does_not_import(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "builder.py").write_text("from hubgym import TaskBuilder\n\nclass Broken(TaskBuilder:\n")
    for _ in range(2):  # the second attempt must see the same cause, not a half-imported module
        result = hubgym("check", folder)
        assert result.exit_code == 1
        message = one_line(result.output)
        assert "/ check_declaration" in message and "SyntaxError: invalid syntax (builder.py, line 3)" in message
        assert "Traceback" not in result.output


@pytest.mark.parametrize("name, reason", [
    ("2fast", "breaks the rule for env names: 1-64 ASCII letters, digits and '_', starting with a letter"),
    ("add-numbers", "breaks the rule for env names: 1-64 ASCII letters, digits and '_', starting with a letter"),
    ("add_numbers-v2", "ends in -v<N>, which is the version's place"),
    ("lambda", "is a Python keyword"),
    ("arithmetic", "is taken by a built-in environment"),
    ("json", "would shadow the Python module 'json'"),
])
def test_init_refuses_bad_names(tmp_path, name, reason):
    result = hubgym("init", name, "--dir", tmp_path)
    assert result.exit_code == 1
    assert f"env name '{name}' {reason}" in one_line(result.output) and "Fix:" in result.output
    assert not list(tmp_path.iterdir())


def test_init_never_overwrites(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "builder.py").write_text("# my work\n")
    result = hubgym("init", "mine", "--dir", tmp_path)
    assert result.exit_code == 1
    assert "already exists; hubgym init never overwrites files" in one_line(result.output)
    assert (tmp_path / "mine" / "builder.py").read_text() == "# my work\n"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # no staging folder left behind


@pytest.mark.slow
def test_main_job_runs_every_stage(tmp_path):
    """`hubgym demo` (short training) through the installed script: every stage, its files, the report."""
    script = Path(sys.executable).with_name("hubgym")
    out = tmp_path / "demo"
    done = subprocess.run([script, "demo", "--model", "tiny", "--env", "arithmetic", "--out", out, "--max-rows", "10",
                           "--offline-steps", "2", "--online-steps", "3"], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    text = one_line(done.stdout)
    for stage in ("1 model", "2 envs", "3 hub", "4 rollouts", "5 re-score", "6 train", "7 report"):
        assert stage in text
    assert f"all {len(CHECKS) + 1} checks passed" in text and "-> 25 rows" in text
    assert "0 of 200 rows changed" in text  # stored rewards equal a fresh re-score from the hub
    assert "held-out evaluation" in text and "pass@k" in text
    for png in ("eval.png", "rescored/rescore.png", "train/metrics.png"):
        assert (out / png).stat().st_size > 0
    assert (out / "train" / "model" / "model.safetensors").exists()
    from hubgym.hub.factory import get_hub

    card = (get_hub(out / "hub").resolve("demo/rollouts").path / "README.md").read_text()
    assert "config_name: initial" in card and "config_name: online" in card  # teacher run + online rollouts


@pytest.mark.slow
def test_console_script_smoke(tmp_path):
    """The installed `hubgym` script scaffolds an env whose own tests (the plugin's fixture) pass under pytest."""
    script = Path(sys.executable).with_name("hubgym")
    made = subprocess.run([script, "init", "count_up", "--dir", tmp_path], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert "created" in made.stdout and (tmp_path / "count_up" / "test_env.py").is_file()
    tested = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tmp_path / "count_up"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "2 passed" in tested.stdout


@pytest.mark.slow
def test_the_local_rank_deepspeeds_launcher_puts_before_the_command_is_dropped():
    """`deepspeed ... $(which hubgym) train cfg.yaml` runs `hubgym --local_rank=0 train cfg.yaml`."""
    result = subprocess.run([sys.executable, "-m", "hubgym", "--local_rank=0", "envs", "arithmetic",
                             "--format", "names"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "arithmetic" in result.stdout.split()
    from hubgym.cli import without_launcher_rank

    assert without_launcher_rank(["--local_rank", "1", "train", "c.yaml"]) == ["train", "c.yaml"]
    assert without_launcher_rank(["train", "--local_rank=1"]) == ["train", "--local_rank=1"]  # only before the command
