"""`hubgym push` through the real CLI, then the printed lines followed exactly as written (no hub added by hand)."""

import re

import pytest
from typer.testing import CliRunner

import hubgym
from hubgym.cli import app


def test_push_then_load_with_the_printed_line(tmp_path):
    hub = str(tmp_path / "hub")  # not the default hub: the printed lines must name it
    result = CliRunner().invoke(app, ["push", "arithmetic", "demo/arithmetic", "--config", "easy", "--hub", hub],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    line = re.search(r"load it with: (hubgym\.load_env\(.*\))", result.output).group(1)
    ref, sha = re.search(r"load_env\('([^']+)', pin='sha256:([0-9a-f]{64})'", line).groups()
    assert line == f"hubgym.load_env({ref!r}, pin='sha256:{sha}', hub={hub!r})"
    assert f"sample it with: hubgym rollout {ref} --pin demo/arithmetic=sha256:{sha} --hub {hub}" in result.output
    env = eval(line, {"hubgym": hubgym})  # exactly as printed
    assert set(env.tasks) == {"train", "test"} and env.revision == ref.split("@")[1]
    test = env.tasks["test"]
    assert len(test) == 30 and test[0]["env"] == "arithmetic"
    assert env.verifier.score(test[0], [hubgym.assistant("<answer>-1</answer>")]).error is None


def test_push_to_the_default_hub_prints_no_hub(tmp_path):
    hub = str(tmp_path / "hub")
    result = CliRunner().invoke(app, ["push", "arithmetic", "demo/a", "--config", "easy"],
                                env={"COLUMNS": "400", "HUBGYM_HUB": hub})
    assert result.exit_code == 0, result.output
    line = re.search(r"load it with: (hubgym\.load_env\(.*\))", result.output).group(1)
    assert "hub=" not in line and "--hub" not in result.output


def test_push_unknown_config_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(app, ["push", "arithmetic", "demo/a", "--config", "nope", "--hub", str(tmp_path)])
    assert result.exit_code == 1 and "nope" in result.output


@pytest.mark.slow
def test_the_printed_commands_are_unbroken_lines_on_a_narrow_terminal_and_in_a_pipe(tmp_path):
    """Copy-paste must work whatever the width: every printed command is one line, in a 40-column terminal as in
    a pipe (CliRunner's stdout is not a terminal)."""
    hub = str(tmp_path / "a-hub-folder-with-a-long-name-that-passes-forty-columns")
    for env in ({"COLUMNS": "40"}, {}):
        result = CliRunner().invoke(app, ["push", "arithmetic", "demo/arithmetic", "--config", "easy", "--hub", hub],
                                    env=env)
        assert result.exit_code == 0, result.output
        load = next(line for line in result.output.splitlines() if line.startswith("load it with: "))
        sample = next(line for line in result.output.splitlines() if line.startswith("sample it with: "))
        assert re.fullmatch(r"load it with: hubgym\.load_env\('demo/arithmetic@[0-9a-f]{40}', "
                            r"pin='sha256:[0-9a-f]{64}', hub='.*forty-columns'\)", load)
        assert re.fullmatch(r"sample it with: hubgym rollout demo/arithmetic@[0-9a-f]{40} "
                            r"--pin demo/arithmetic=sha256:[0-9a-f]{64} --hub \S+forty-columns", sample)
