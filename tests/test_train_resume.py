"""A `hubgym train` run killed with SIGKILL and started again ends with the weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers.scored_runs import make_run

pytestmark = pytest.mark.slow
STEPS = 60


def train_command(model: Path, rollouts: Path, out: Path) -> list[str]:
    script = Path(sys.executable).with_name("hubgym")
    sets = [f"model={model}", f"output_dir={out}", f"offline.sources=[{rollouts}]", f"offline.steps={STEPS}",
            "eval.limit=0", "checkpoint_every=5", "batch.groups_per_step=2", "grpo.n=2", "log.every=1000"]
    return [str(script), "train", *[arg for s in sets for arg in ("--set", s)]]


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return {**clean, "OMP_NUM_THREADS": "1"}


def latest_step(out: Path) -> int:
    latest = out / "checkpoints" / "latest.json"
    return json.loads(latest.read_text())["step"] if latest.exists() else -1


def test_killed_run_resumes_to_the_same_weights(tiny_model, tmp_path):
    rollouts = make_run(tmp_path / "rollouts", "r", groups=12)  # rewards 1 and 0 in every group: all trainable
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = subprocess.run(train_command(tiny_model, rollouts, straight), env=env(), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    proc = subprocess.Popen(train_command(tiny_model, rollouts, killed), env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while latest_step(killed) < 9 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = latest_step(killed)
    assert 9 <= at_kill < STEPS - 1  # killed mid-run, after a checkpoint
    assert not (killed / "model").exists()

    resumed = subprocess.run(train_command(tiny_model, rollouts, killed), env=env(), capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    a = load_file(str(straight / "model" / "model.safetensors"))
    b = load_file(str(killed / "model" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    steps_logged = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()
                    if '"policy/loss"' in line]
    assert steps_logged[-1] == STEPS - 1 and at_kill + 1 in steps_logged  # the resumed run went on from the checkpoint
