"""`hubgym serve MODEL`: a real vLLM server started the way hubgym starts its own, printing its base URL and served
name, answering OpenAI clients under either name, and gone after Ctrl-C; bad settings are one line before vLLM
starts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

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


@pytest.mark.slow
def test_serve_prints_its_url_and_name_and_answers_until_ctrl_c(tiny_model, tmp_path):
    import openai

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "hubgym", "serve", "tiny", "--port", str(port),
                                "--max-model-len", "512", "--kv-cache-gib", "1"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
    lines = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            assert line or process.poll() is None, "".join(lines)
            lines.append(line)
            if line.startswith("serving "):
                break
        served = re.match(r"serving (\S+) at (http://127\.0\.0\.1:\d+/v1) \(max_model_len 512, dtype float32",
                          lines[-1])
        assert served and served.groups() == ("tiny", f"http://127.0.0.1:{port}/v1"), "".join(lines)
        client = openai.OpenAI(base_url=served.group(2), api_key="none")
        assert {m.id for m in client.models.list()} == {"tiny", str(tiny_model)}  # the name, and the folder
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4, logprobs=True)
        assert reply.choices[0].logprobs.content and reply.usage.completion_tokens <= 4
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(120)
    assert process.returncode == 0 and "stopping" in process.stdout.read()
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0).models.list()
