"""Stopping a run mid-rollout (Ctrl-C): the online step being sampled is cancelled at once, nothing of it is
stored, and the step is sampled whole when the run resumes. With the real vLLM engine and the tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hubgym.errors import RolloutsStopped
from hubgym.hub.rollouts import iter_rollouts
from hubgym.engines import SamplingArgs, VLLMEngine
from hubgym.rollout.tokens import ChatRenderer
from hubgym.train.online import OnlineProducer

pytestmark = pytest.mark.slow
GROUPS, N = 8, 4


@pytest.fixture(scope="module")
def engine(tiny_model):
    engine = VLLMEngine(str(tiny_model), max_model_len=1024, enforce_eager=True, separate_core=True)
    yield engine
    engine.close()


def producer(model, out, stop: threading.Event) -> OnlineProducer:
    # Long replies (the random model rarely stops by itself), so a step is still sampling when it is stopped.
    return OnlineProducer([("arithmetic:tiny", 1.0)], split="train", model=str(model), out_dir=out, n=N,
                          sampling=SamplingArgs(max_tokens=200), max_model_len=1024, stop=stop)


def until(condition, what: str, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting until {what}"
        time.sleep(0.01)


def test_a_stopped_step_stores_nothing_and_is_sampled_whole_on_resume(engine, tiny_model, tmp_path):
    stop = threading.Event()
    online = producer(tiny_model, tmp_path / "online", stop)
    renderer = ChatRenderer(engine.tokenizer)
    outcome: dict = {}

    def sample() -> None:
        try:
            outcome["rows"] = online.produce(engine, renderer, step=0, version=0, groups=GROUPS)
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=sample)
    thread.start()
    until(engine.llm.llm_engine.has_unfinished_requests, "vLLM runs the step's requests")
    stop.set()
    thread.join(120)

    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), RolloutsStopped), outcome
    assert "step 0" in str(outcome["error"])
    until(lambda: not engine.llm.llm_engine.has_unfinished_requests(), "the cancelled requests are aborted")
    assert not (tmp_path / "online" / "manifest-step000000.json").exists()
    assert not list((tmp_path / "online").glob("shards/*.arrow"))

    resumed = producer(tiny_model, tmp_path / "online", threading.Event())
    rows = resumed.produce(engine, renderer, step=0, version=0, groups=GROUPS)
    assert len(rows) == GROUPS * N
    stored = list(iter_rollouts([tmp_path / "online"]))
    assert sorted(r["rollout_id"] for r in stored) == sorted(r["rollout_id"] for r in rows)


def train_command(model: Path, out: Path) -> list[str]:
    sets = [f"model={model}", f"output_dir={out}", "online.steps=3", "checkpoint_every=1", "eval.limit=0",
            f"batch.groups_per_step={GROUPS}", f"grpo.n={N}", "sampling.max_tokens=200", "grpo.zero_variance=keep"]
    return [str(Path(sys.executable).with_name("hubgym")), "train", "tiny",
            *[arg for s in sets for arg in ("--set", s)]]


def test_ctrl_c_stops_hubgym_train_mid_rollout_and_the_same_command_resumes(tiny_model, tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    # A terminal's Ctrl-C sends SIGINT to the whole process group: the trainer and vLLM's processes.
    proc = subprocess.Popen(train_command(tiny_model, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    until(lambda: (out / "online" / "manifest-step000000.json").exists() or proc.poll() is not None,
          "step 0 is stored", limit_s=600)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)

    assert proc.returncode == 130, stdout[-2000:] + stderr[-3000:]
    assert "interrupted: the same command resumes" in stderr
    assert "restarting it" not in stdout + stderr  # vLLM died with the Ctrl-C: no new engine for a stopping run
    stored = sorted(p.name for p in (out / "online").glob("manifest-*.json"))
    assert stored and len(stored) < 3  # stopped mid-run
    shards = {p.name.split("-")[0] for p in (out / "online" / "shards").glob("*.arrow")}
    assert shards == {name.removeprefix("manifest-").removesuffix(".json") for name in stored}  # no partial step

    resumed = subprocess.run(train_command(tiny_model, out), env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    rows = list(iter_rollouts([out / "online"]))
    assert len(rows) == 3 * GROUPS * N
    assert len({r["rollout_id"] for r in rows}) == len(rows)
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if '"policy/loss"' in line]
    assert steps[-1] == 2
