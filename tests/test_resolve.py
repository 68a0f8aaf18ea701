"""Stored data never chooses code: a row's env picks only among verifiers the user chose.

Rows are real Arrow shards as a hostile rollout repo would hold them (written by pyarrow: hubgym's writer stores
no env that is not an env name): a consistent run (hashes, manifest) whose `env` column names a file, a folder, a
hub ref, a module path or any other value that is not a registered env. Each such value is refused by `hubgym
score` and `hubgym replay` (CLI and Python) with one line naming the value and either the flag that allows it or
the row contract's env-name rule, and the named code is never imported (its import would write a marker file).
The same file given by the user on the command line runs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import pyarrow as pa

import pytest
from typer.testing import CliRunner

from hubgym.envs import build_tasks
from hubgym.cli import app
from hubgym.errors import EnvNotFoundError, RescoreError, ShardError
from hubgym.envs import push_env
from hubgym.envs import open_env, stored_env_verifier
from hubgym.schemas import assistant
from hubgym.schemas.tables import rollouts_to_table
from hubgym.score import rescore
from hubgym.score.replay import replay

EVIL = """\
from pathlib import Path
Path({marker!r}).write_text("imported")
REWARDS = {{}}
def reset(task): return {{}}, "obs"
def step(task, state, action): return state, "obs", 0.0, True
"""


@pytest.fixture
def evil(tmp_path) -> tuple[Path, Path]:
    """A verifier file whose import leaves a marker, in a folder that also looks like an env folder."""
    marker = tmp_path / "imported.txt"
    folder = tmp_path / "evil_env"
    folder.mkdir()
    (folder / "verifier.py").write_text(EVIL.format(marker=str(marker)))
    (folder / "builder.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n")
    return folder, marker


def hostile_values(folder: Path) -> list[str]:
    """Env values of every kind that is not a registered env name."""
    return [str(folder / "verifier.py"), str(folder), str(folder / "builder.py"), "./evil_env", "../evil_env",
            "org/evil", "org/evil@main", "hubgym.verifiers.arithmetic", "os:system", "", "arithmetic\n",
            "arithmetic-v9", "no_such_env", "x" * 300]


def write_run(folder: Path, env_value: str, envs=(("arithmetic", "easy"),), tasks_per_env: int = 2) -> Path:
    """A consistent run folder of scored single-turn rows whose env column holds `env_value` (first env): one shard
    written by pyarrow, its sha256 and rows in the manifest, as a hostile repo would hold it."""
    rows = []
    for index, (env, config) in enumerate(envs):
        tasks = build_tasks(env, config)["test"]
        for t in range(tasks_per_env):
            name = env_value if index == 0 else env
            rows += [_row(tasks[t], name, f"g{index}{t}", s) for s in range(2)]
    (folder / "shards").mkdir(parents=True)
    shard = folder / "shards" / "w000of001-00000.arrow"
    table = rollouts_to_table(rows)
    with pa.ipc.new_file(str(shard), table.schema) as writer:
        writer.write_table(table)
    record = {"sha256": hashlib.sha256(shard.read_bytes()).hexdigest(), "rows": len(rows)}
    (folder / "manifest-w000of001.json").write_text(json.dumps(
        {"run_id": "r", "model": "m", "policy_version": 0, "sampling": {}, "envs": {},
         "shard_files": {shard.name: record}}))
    return folder


def _row(task: dict, env: str, group: str, sample: int) -> dict:
    completion = [assistant(f"<answer>{task['info'].get('answer', 'x') if sample == 0 else 'nope'}</answer>")]
    return {"rollout_id": f"r-{group}-{sample}", "run_id": "r", "task_id": task["id"], "env": env, "group": group,
            "sample": sample, "prompt": task["prompt"], "completion": completion, "info": task["info"],
            "interaction": task["interaction"], "prompt_ids": [1, 2], "completion_ids": [3], "completion_mask": [1],
            "completion_logprobs": [-0.5], "tokens_consistent": True, "reward": 0.0, "metrics": [],
            "finish_reason": "stop", "truncated": False, "num_turns": 1, "error": None,
            "provenance": {"model": "m", "policy_version": 0, "sampling": "{}", "env_repo": None,
                           "env_revision": None, "verifier_module": "v", "verifier_sha256": "0" * 64,
                           "engine": "vllm", "engine_version": "0", "chat_template_sha256": None},
            "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0},
            "created_at": dt.datetime.now(dt.timezone.utc)}


def test_a_stored_env_value_that_is_not_registered_loads_no_code(evil):
    folder, marker = evil
    for value in hostile_values(folder):
        with pytest.raises(EnvNotFoundError) as caught:
            stored_env_verifier(value)
        message = str(caught.value)
        assert repr(value)[:200] in message and "--verifier" in message and "--env-revision" in message, value
    assert not marker.exists()
    assert stored_env_verifier("arithmetic").env == "arithmetic"
    assert stored_env_verifier("arithmetic-v2").env == "arithmetic"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["score", "replay"])
def test_score_and_replay_refuse_rows_naming_code_in_one_line(evil, tmp_path, command):
    folder, marker = evil
    for i, value in enumerate(v for v in hostile_values(folder) if "\n" not in v):
        run = write_run(tmp_path / f"run{i}", value)
        result = CliRunner().invoke(app, [command, str(run)])
        assert result.exit_code == 1, (value, result.output)
        assert "Traceback" not in result.output, result.output
        assert "--verifier" in result.output or "breaks rule env-name" in result.output, result.output  # no code
        assert repr(value)[:60] in result.output.replace("\n", ""), (value, result.output)
    assert not marker.exists()


def test_python_rescore_and_replay_refuse_them_too(evil, tmp_path):
    folder, marker = evil
    run = write_run(tmp_path / "run", str(folder / "verifier.py"))
    with pytest.raises(ShardError, match="breaks rule env-name"):  # not even an env name: no env is looked up
        rescore(str(run), workers=1)
    with pytest.raises(ShardError, match="breaks rule env-name"):
        replay(str(run))
    run = write_run(tmp_path / "named", "evil_env")  # an env name that no env has
    with pytest.raises(EnvNotFoundError, match="never chooses"):
        rescore(str(run), workers=1)
    with pytest.raises(EnvNotFoundError, match="never chooses"):
        replay(str(run))
    assert not marker.exists()


def test_the_same_file_runs_when_the_user_names_it(evil, tmp_path):
    folder, marker = evil
    run = write_run(tmp_path / "run", "evil_env")
    result = CliRunner().invoke(app, ["score", str(run), "--verifier", f"evil_env={folder / 'verifier.py'}"])
    assert result.exit_code == 0, result.output
    assert marker.exists()


@pytest.mark.slow
def test_a_verifier_source_per_env(tmp_path):
    """A hub env revision for one env's rows and a module for the other's, in one re-score."""
    hub = tmp_path / "hub"
    pushed = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"])
    sha = pushed.manifest["code"]["sha256"]
    module = tmp_path / "rev_v2.py"
    module.write_text("def same(task, completion):\n    return 0.25\n\nREWARDS = {same: 1.0}\n")
    run = write_run(tmp_path / "run", "arithmetic", envs=(("arithmetic", "easy"), ("reverse_text", "words")))
    result = rescore(str(run), verifier={"reverse_text": str(module)}, env_revision=[pushed.ref],
                     pin=[f"org/arith=sha256:{sha}"], hub=str(hub), workers=1)
    assert result.verifiers["arithmetic"].origin == pushed.ref
    assert result.verifiers["reverse_text"].origin == "module"
    cli = CliRunner().invoke(app, ["score", str(run), "--env-revision", pushed.ref, "--pin", f"org/arith=sha256:{sha}",
                                   "--verifier", f"reverse_text={module}", "--hub", str(hub)])
    assert cli.exit_code == 0, cli.output
    with pytest.raises(RescoreError, match="two verifiers given for env 'arithmetic'"):
        rescore(str(run), verifier={"arithmetic": str(module)}, env_revision=[pushed.ref], pin=sha, hub=str(hub))


def test_an_unknown_config_or_split_is_one_clear_error():
    with pytest.raises(Exception, match=r"has no config 'nope'.*easy") as caught:
        open_env("arithmetic:nope").take("test", 1)
    assert "arithmetic" in str(caught.value)
    with pytest.raises(Exception, match=r"has no split 'dev'"):
        open_env("arithmetic:easy").take("dev", 1)
