"""vLLM's INFO lines stay out of hubgym's output by default (in this process and in vLLM's spawned engine
processes), and `--verbose` brings them back: a real tiny rollout through the installed command, each way."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.engines import ENGINE_PROCESSES
from hubgym.engines.vllm_logging import apply_vllm_log_level, set_verbose

VLLM_INFO = re.compile(r"^\((\w+)(?:-\d+)? pid=\d+\) INFO ", re.M)  # "(EngineCore pid=12) INFO 11-25 ..."
VLLM_WARNING = re.compile(r"^\((\w+)(?:-\d+)? pid=\d+\) WARNING ", re.M)
LOADING = "Loading safetensors checkpoint shards"


def rollout(tiny_model: Path, out: Path, *flags: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")}  # the user sets no level
    env.update(ENGINE_PROCESSES)  # the engine processes' own log lines are what this proves quiet
    done = subprocess.run([Path(sys.executable).with_name("hubgym"), "rollout", "arithmetic:tiny", "--model",
                           tiny_model, "--limit", "1", "--n", "1", "--max-tokens", "8", "--out", out, *flags],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 rollouts written" in done.stdout
    return done.stdout + done.stderr


@pytest.mark.slow
def test_a_rollout_shows_no_vllm_info_lines_unless_verbose(tiny_model, tmp_path):
    quiet = rollout(tiny_model, tmp_path / "quiet")
    assert VLLM_INFO.findall(quiet) == [] and VLLM_WARNING.findall(quiet) == [] and LOADING not in quiet, quiet
    verbose = rollout(tiny_model, tmp_path / "verbose", "--verbose")
    assert {"MainProcess", "EngineCore"} <= set(VLLM_INFO.findall(verbose))  # the engine process follows too
    assert LOADING in verbose  # the weight-loading bar, once per engine start and weight sync


def test_the_level_is_error_by_default_and_a_users_level_wins(monkeypatch):
    for name in ("VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING"):
        monkeypatch.delenv(name, raising=False)
    apply_vllm_log_level()
    assert (os.environ["VLLM_LOGGING_LEVEL"], os.environ["VLLM_CONFIGURE_LOGGING"]) == ("ERROR", "1")
    set_verbose(True)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    set_verbose(True)
    apply_vllm_log_level()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    set_verbose(False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
