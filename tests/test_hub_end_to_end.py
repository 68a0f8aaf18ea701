"""The whole path against the loopback Hub-API server, through the real CLI and the clients' default cache layout:
push a user's env -> load_env -> rollout -> score -> push-rollouts -> train, each step following what the one
before printed. Tiny sizes: 4 tasks x 2 samples, 8 tokens, 2 training steps."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hubgym
from hubgym.cli import app
from hubgym.hub.rollouts import iter_rollouts

from helpers.hub_server import TOKEN

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

BUILDER = '''"""parity: reply with a text of even length (a reward a random model earns about half the time).

Task: reply with any text whose length is even.
Row schema: info = {"i": int}; interaction single_turn.
Reward: even (weight 1): the reply has an even number of characters.
Arguments: config default; TaskConfig.sizes.
Version history:
    v1: first release.
"""
from hubgym import TaskBuilder, TaskConfig, make_task, user


class Parity(TaskBuilder):
    __doc__ = __doc__
    ENV, VERIFIER, GOLDEN = "parity", "verifier.py", "golden.jsonl"
    BUILDER_CONFIGS = [TaskConfig(name="default", sizes={"train": 4, "test": 4})]

    def generate_tasks(self, split, size, seed):
        for i in range(size):
            yield make_task(self.ENV, [user(f"{split} task {i}: say something")], {"i": i})
'''

VERIFIER = '''def even(task, completion):
    return float(len(completion[-1]["content"] or "") % 2 == 0)


REWARDS = {even: 1.0}
'''

GOLDEN = ('{"name": "even", "task": {"info": {"i": 0}}, "completion": [{"role": "assistant", "content": "ab"}], '
          '"reward": 1.0}\n{"name": "odd", "task": {"info": {"i": 0}}, "completion": [{"role": "assistant", '
          '"content": "a"}], "reward": 0.0}\n')


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_push_load_rollout_score_push_rollouts_train_over_http(hub_client, tiny_model, tmp_path, monkeypatch):
    hub_client.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    url, env_dir = hub_client.url, tmp_path / "parity"
    env_dir.mkdir()
    for name, text in (("builder.py", BUILDER), ("verifier.py", VERIFIER), ("golden.jsonl", GOLDEN)):
        (env_dir / name).write_text(text)

    # push: the printed lines name this (non-default) hub
    pushed = invoke("push", str(env_dir), "org/parity", "--hub", url)
    load_line = re.search(r"load it with: (hubgym\.load_env\(.*\))", pushed).group(1)
    ref, pin_option = re.search(r"sample it with: hubgym rollout (\S+) (--pin .*)", pushed).groups()
    assert f"hub={url!r}" in load_line and pin_option.endswith(f"--hub {url}")

    # load_env, exactly as printed: the verifier is read through the cache's link into blobs/
    env = eval(load_line, {"hubgym": hubgym})
    assert (env.path / "verifier.py").is_symlink() and env.verifier.score(
        env.tasks["test"][0], [hubgym.assistant("ab")]).reward == 1.0

    # rollout, as printed (its own vLLM engine, in a subprocess of the installed command)
    run = tmp_path / "run"
    command = [str(Path(sys.executable).with_name("hubgym")), "rollout", f"{ref}:default", *shlex.split(pin_option),
               "--model", str(tiny_model), "--n", "2", "--limit", "4", "--max-tokens", "8", "--max-model-len", "512",
               "--out", str(run)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = list(iter_rollouts(run))
    assert len(rows) == 8 and {r["provenance"]["env_repo"] for r in rows} == {"org/parity"}
    assert {r["provenance"]["env_revision"] for r in rows} == {env.revision}
    assert {r["provenance"]["verifier_sha256"] for r in rows} == {env.verifier.sha256}

    # score with the hub revision's verifier (worker processes load it from the cache too): nothing changes
    scored = invoke("score", str(run), "--env-revision", ref, *shlex.split(pin_option), "--workers", "2",
                    "--out", str(tmp_path / "rescored"))
    assert "what changed: 0 of 8 rows" in scored
    assert {r["rescore_reward"] for r in iter_rollouts(tmp_path / "rescored")} == {r["reward"] for r in rows}

    # push-rollouts, then train on the pushed run, streamed back from the hub
    shared = invoke("push-rollouts", str(run), "org/rollouts", "--name", "parity-run", "--hub", url)
    rollouts_ref = re.search(r"-> (org/rollouts@[0-9a-f]{40}:parity-run)", shared).group(1)
    out, config = tmp_path / "train", tmp_path / "train.yaml"
    config.write_text(json.dumps({  # (JSON is YAML)
        "model": str(tiny_model), "output_dir": str(out), "envs": [{"name": f"{ref}:default"}],
        "offline": {"sources": [rollouts_ref], "steps": 2}, "online": {"steps": 0}, "eval": {"limit": 0},
        "grpo": {"n": 2, "zero_variance": "keep"}, "batch": {"groups_per_step": 2}, "log": {"every": 1000}}))
    invoke("train", str(config), "--hub", url, *shlex.split(pin_option))  # pinned, as rollout and score were
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "policy/loss" in r]
    assert [r["step"] for r in steps] == [0, 1] and (out / "model" / "config.json").is_file()
