"""`hubgym push` through the real CLI into a local hub folder, then `load_env` with the printed pin."""

import re

from typer.testing import CliRunner

import hubgym
from hubgym.cli import app


def test_push_then_load_with_printed_pin(tmp_path):
    result = CliRunner().invoke(app, ["push", "arithmetic", "demo/arithmetic", "--config", "easy",
                                      "--hub", str(tmp_path / "hub")], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    ref = re.search(r"load_env\('([^']+)'", result.output).group(1)
    pin = re.search(r"pin='(sha256:[0-9a-f]{64})'", result.output).group(1)
    env = hubgym.load_env(ref, pin=pin, hub=str(tmp_path / "hub"), config="easy", split="test")
    assert len(env.tasks) == 30 and env.tasks[0]["env"] == "arithmetic"
    assert env.verifier.score(env.tasks[0], [hubgym.assistant("<answer>-1</answer>")]).error is None


def test_push_unknown_config_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(app, ["push", "arithmetic", "demo/a", "--config", "nope", "--hub", str(tmp_path)])
    assert result.exit_code == 1 and "nope" in result.output
