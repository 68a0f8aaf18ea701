"""`hubgym serve MODEL`: bad settings are one line before vLLM starts. The server itself (started as printed, its
base URL and served name printed, answering verifiers' vf-eval, stopped) is the verifiers example of
docs/integrations.md, run by tests/test_docs.py: one vLLM server start for both."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.engines.server import free_port

runner = CliRunner()


@pytest.mark.parametrize("args, says", [
    (["--dtype", "float8"], "--dtype='float8' is not a vLLM dtype"),
    (["--tool-parser", "no-such-parser"], "--tool-parser 'no-such-parser' is not one of vLLM's tool parsers"),
    (["--max-model-len", "999999"], "--max-model-len 999999 is more than the"),
])
def test_a_bad_setting_is_one_line_before_vllm_starts(tiny_model, args, says):
    done = runner.invoke(app, ["serve", str(tiny_model), "--port", str(free_port()), *args])
    assert done.exit_code == 1 and says in done.output and "Traceback" not in done.output
