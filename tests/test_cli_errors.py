"""Every command given a bad path, a bad model, a bad config or damaged stored data: exit code 1 and one red line
that says what is wrong (never a traceback), run in-process with CliRunner and, for stored data, as the
installed command in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.errors import ContextLengthError
from hubgym.models import context_length, resolve_model
from hubgym.models.tiny import default_tiny_model
from helpers.scored_runs import write_run

runner = CliRunner()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A good run, runs with one damaged file each, a model folder of 2,048 positions, a folder that is no model."""
    root = tmp_path_factory.mktemp("cli-errors")
    good = write_run(root / "good")
    first = "shards/w000of001-00000.arrow"

    def damaged(name: str, change, recorded: bool = True) -> None:
        run = Path(shutil.copytree(good, root / name))
        if not recorded:
            (run / "manifest-w000of001.json").unlink()
        change(run)

    def rewrite(run: Path, change) -> None:
        path = run / first
        table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        path.unlink()
        with pa.ipc.new_file(str(path), change(table).schema) as writer:
            writer.write_table(change(table))

    damaged("truncated", lambda r: (r / first).write_bytes((r / first).read_bytes()[:700]))
    damaged("empty", lambda r: (r / first).write_bytes(b""), recorded=False)
    damaged("flipped", lambda r: (r / first).write_bytes(_flip((r / first).read_bytes())))
    damaged("wrong-column", lambda r: rewrite(r, lambda t: t.drop_columns(["completion"])), recorded=False)
    damaged("wrong-type", lambda r: rewrite(r, lambda t: t.set_column(t.schema.get_field_index("reward"), "reward",
                                                                      t.column("reward").cast(pa.string()))),
            recorded=False)
    damaged("bad-manifest", lambda r: (r / "manifest-w000of001.json").write_bytes(b"{\"run_id\": \"r1\", "))
    (root / "no-shards").mkdir()
    (root / "bad-out").mkdir()  # a score --out folder whose earlier manifest was damaged
    (root / "bad-out" / "manifest-w000of001.json").write_bytes(b'{"kind": ')
    model = root / "model-2048"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 2048}))
    (root / "not-a-model").mkdir()
    (root / "train.yaml").write_text("model: tiny\nno_such_option: 3\n")
    return root


def _flip(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]


W = "{world}"  # replaced by the world folder in each case

# (id, arguments, what the one line must say)
CASES = [
    *[(f"{command}-{damage}", [command, f"{W}/{damage}", *extra], said)
      for command, extra in (("report", []), ("score", ["--workers", "1"]), ("replay", []))
      for damage, said in (("missing", "does not exist"), ("truncated", "w000of001-00000.arrow is corrupted"),
                           ("empty", "w000of001-00000.arrow is truncated or corrupted"),
                           ("flipped", "w000of001-00000.arrow is corrupted: its sha256 is"),
                           ("wrong-column", "does not have the rollout schema (missing or mistyped: completion"),
                           ("wrong-type", "does not have the rollout schema (missing or mistyped: reward"),
                           ("bad-manifest", "manifest-w000of001.json is not valid JSON"),
                           ("no-shards", "no rollout shards"))],
    ("push-rollouts-bad-manifest", ["push-rollouts", f"{W}/bad-manifest", "org/r", "--hub", f"{W}/hub"],
     "manifest-w000of001.json is not valid JSON"),
    ("push-rollouts-truncated", ["push-rollouts", f"{W}/truncated", "org/r", "--hub", f"{W}/hub"],
     "w000of001-00000.arrow is truncated or corrupted"),
    ("score-no-such-verifier", ["score", f"{W}/good", "--verifier", f"arithmetic={W}/no_such_verifier.py"],
     "verifier {world}/no_such_verifier.py cannot be read (FileNotFoundError"),
    ("score-out-bad-manifest", ["score", f"{W}/good", "--out", f"{W}/bad-out", "--workers", "1"],
     "bad-out/manifest-w000of001.json is not valid JSON"),
    ("score-no-such-verifier-module", ["score", f"{W}/good", "--verifier", "arithmetic=no_such_verifier_module"],
     "no module named 'no_such_verifier_module'"),
    ("rollout-no-such-env", ["rollout", "no_such_env", "--model", f"{W}/model-2048"], "no_such_env"),
    ("rollout-no-such-config", ["rollout", "arithmetic:no-such-config", "--model", f"{W}/model-2048"],
     "env 'arithmetic' has no config 'no-such-config'"),
    ("rollout-no-such-model", ["rollout", "arithmetic", "--model", f"{W}/no-such-model"],
     "--model {world}/no-such-model: no such folder"),
    ("rollout-not-a-model", ["rollout", "arithmetic", "--model", f"{W}/not-a-model"],
     "holds no config.json, so it is no model folder"),
    ("rollout-offline-hub-model", ["rollout", "arithmetic", "--model", "no-such-org/no-such-model"],
     "--model no-such-org/no-such-model: the Hub cannot be reached"),
    ("rollout-context-too-long", ["rollout", "arithmetic", "--model", f"{W}/model-2048", "--max-model-len", "4096"],
     "--max-model-len 4096 is more than the 2048 positions of the model"),
    ("rollout-openai-without-url", ["rollout", "arithmetic", "--engine", "openai", "--model", "m"],
     "--engine openai needs --base-url"),
    ("train-no-such-config", ["train", f"{W}/no-such.yaml"], "no-such.yaml"),
    ("train-unknown-option", ["train", f"{W}/train.yaml"], "no_such_option"),
    ("train-no-such-model", ["train", "--set", f"model={W}/no-such-model"],
     "the `model` setting (YAML `model:`, or --set model=...) {world}/no-such-model: no such folder"),
    ("replay-no-such-model", ["replay", f"{W}/good", "--model", f"{W}/no-such-model"],
     "--model {world}/no-such-model: no such folder"),
    ("check-no-such-env", ["check", "no_such_env"], "no_such_env"),
    ("build-no-such-config", ["build", "arithmetic", "--config", "no-such-config", "--out", f"{W}/built"],
     "no-such-config"),
]


@pytest.mark.parametrize("args,said", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_red_line_and_exit_code_1(world, args, said):
    result = runner.invoke(app, [a.replace(W, str(world)) for a in args], env={"COLUMNS": "300"})
    # CliRunner catches what escapes: anything but typer's exit would be a traceback in a terminal
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (result.exception, result.output)
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    assert said.replace(W, str(world)) in errors[0], errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "wrong-type", "bad-manifest"])
def test_the_installed_command_prints_no_traceback_for_damaged_stored_data(world, damage):
    for command in (["report"], ["score", "--workers", "1"]):
        done = subprocess.run([sys.executable, "-m", "hubgym", *command, str(world / damage)], capture_output=True,
                              text=True, env={**os.environ, "COLUMNS": "300"}, timeout=300)
        assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout, done.stderr
        assert [line for line in done.stderr.splitlines() if line.strip()][-1].startswith("error: "), done.stderr


SKIP_BAD_COMMANDS = {"report": ["--plot", "{world}/r.png"], "score": ["--workers", "1"], "replay": []}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(SKIP_BAD_COMMANDS))
def test_skip_bad_reads_the_other_shards_and_names_the_bad_one(world, command):
    extra = [a.format(world=world) for a in SKIP_BAD_COMMANDS[command]]
    result = runner.invoke(app, [command, str(world / "flipped"), "--skip-bad", *extra], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "note: skipped 1 bad shard(s) (of 2 in this read), holding 4 row(s): " in result.output  # rows counted
    assert "w000of001-00000.arrow" in result.output and "arithmetic" in result.output
    all_bad = world / f"all-bad-{command}"
    shutil.copytree(world / "empty", all_bad)
    for path in (all_bad / "shards").glob("*.arrow"):
        path.write_bytes(b"")  # every shard bad: the note names them, then one error
    none = runner.invoke(app, [command, str(all_bad), "--skip-bad", *extra], env={"COLUMNS": "300"})
    assert none.exit_code == 1 and "note: skipped 2 bad shard(s) (of 2 in this read)" in none.output
    assert [line for line in none.output.splitlines() if line.startswith("error: ")] == [
        line for line in none.output.splitlines() if "every one of the 2 shard(s)" in line], none.output


def test_replay_model_tiny_is_the_tiny_local_model_and_no_model_says_the_audit_was_skipped(world):
    assert resolve_model("tiny") == str(default_tiny_model())  # what `rollout --model tiny` samples with
    audited = runner.invoke(app, ["replay", str(world / "good"), "--model", "tiny"], env={"COLUMNS": "300"})
    # the stored ids are made up, so every row fails the audit (exit code 1): the point is that it ran, offline
    assert isinstance(audited.exception, SystemExit) and "Traceback" not in audited.output, audited.output
    assert "token audit: first token the chat template does not produce" in audited.output
    assert "token audit skipped" not in audited.output
    skipped = runner.invoke(app, ["replay", str(world / "good")], env={"COLUMNS": "300"})
    assert skipped.exit_code == 0 and "token audit skipped: give --model MODEL_DIR" in skipped.output


def test_the_context_length_defaults_to_the_models_own_limit(world):
    model = str(world / "model-2048")
    assert context_length(model, None) == 2048  # not a fixed 4096 that vLLM would refuse
    assert context_length(model, 1024) == 1024
    with pytest.raises(ValueError, match=r"^max_model_len 4096 is more than the 2048 positions of the model .*; "
                                         r"leave max_model_len out to use 2048, or give at most 2048$"):
        context_length(model, 4096)
    assert context_length(str(default_tiny_model()), None) == 4096  # the tiny model's max_position_embeddings


def test_the_vllm_engine_refuses_a_context_past_the_model_before_vllm_sees_it(world):
    from hubgym.engines import VLLMEngine

    with pytest.raises(ContextLengthError, match=r"^max_model_len 4096 is more than the 2048 positions"):
        VLLMEngine(str(world / "model-2048"), max_model_len=4096)  # training's online.max_model_len goes here
