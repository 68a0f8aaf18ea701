"""The policy on the real DeepSpeed (gloo on CPU): process counts, ZeRO stages, NaN steps and resume agree.

Each case runs tests/ds_steps.py in fresh processes (DeepSpeed's process group is per process)
on the same fixed synthetic batches and compares the final weights.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("ds_steps.py")


def run(model: Path, out: Path, *args: str, procs: int = 1) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    if procs == 1:
        command = [sys.executable, str(SCRIPT)]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
                   "--master_port", str(free_port()), str(SCRIPT)]
    done = subprocess.run([*command, str(model), str(out), *args], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def max_diff(a: Path, b: Path) -> float:
    x, y = load_file(str(a / "weights.safetensors")), load_file(str(b / "weights.safetensors"))
    assert x.keys() == y.keys()
    return max((x[k] - y[k]).abs().max().item() for k in x)


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory) -> Path:
    """Three steps, one process, ZeRO-2."""
    out = tmp_path_factory.mktemp("ref")
    log = run(tiny_model, out, "--steps", "3")
    assert log.count("skipped False") == 3
    return out


def test_training_moves_the_weights(tiny_model, reference, tmp_path):
    run(tiny_model, tmp_path, "--steps", "0")
    assert max_diff(reference, tmp_path) > 1e-3


def test_two_processes_match_one_on_the_same_global_batch(tiny_model, reference, tmp_path):
    log = run(tiny_model, tmp_path, "--steps", "3", procs=2)
    assert "micro 2" in log  # each rank ran half of the 4 micro-batches
    assert max_diff(reference, tmp_path) < 1e-4


def test_zero3_matches_zero2(tiny_model, reference, tmp_path):
    run(tiny_model, tmp_path, "--steps", "3", "--zero", "3")
    assert max_diff(reference, tmp_path) < 1e-4


def test_gradient_accumulation_matches_one_big_micro_batch(tiny_model, reference, tmp_path):
    log = run(tiny_model, tmp_path, "--steps", "3", "--micro-tokens", "100000")
    assert "micro 1" in log
    assert max_diff(reference, tmp_path) < 1e-4


def test_nan_loss_skips_the_step_and_leaves_the_weights(tiny_model, tmp_path):
    one, nan = tmp_path / "one", tmp_path / "nan"
    run(tiny_model, one, "--steps", "1")
    log = run(tiny_model, nan, "--steps", "2", "--nan-at", "1")
    assert "step 1 loss nan skipped True" in log
    assert max_diff(one, nan) == 0.0


def test_resume_from_a_checkpoint_reproduces_the_uninterrupted_run(tiny_model, reference, tmp_path):
    run(tiny_model, tmp_path, "--steps", "3", "--save-at", "1")
    log = run(tiny_model, tmp_path, "--steps", "3", "--resume")
    assert "step 0" not in log and "step 1" in log
    assert max_diff(reference, tmp_path) < 1e-6
