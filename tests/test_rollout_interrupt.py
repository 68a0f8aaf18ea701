"""Ctrl-C in `hubgym rollout`: the run stops with a message that says how to resume, and the same command then
completes it with no rollout sampled twice or left out. With the real vLLM engine and the tiny model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubgym.hub.rollouts import iter_rollouts

pytestmark = pytest.mark.slow
TASKS, N = 100, 8  # 800 rollouts: the first shard (512 rows) is written well before the end


def rollout_command(model: Path, out: Path) -> list[str]:
    return [str(Path(sys.executable).with_name("hubgym")), "rollout", "arithmetic:medium", "--model", str(model),
            "--n", str(N), "--limit", str(TASKS), "--max-tokens", "64", "--max-model-len", "1024", "--out", str(out)]


def test_ctrl_c_stops_hubgym_rollout_and_the_same_command_completes_the_run(tiny_model, tmp_path):
    out = tmp_path / "run"
    # A terminal's Ctrl-C sends SIGINT to the whole process group: hubgym and vLLM's processes.
    proc = subprocess.Popen(rollout_command(tiny_model, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while not list((out / "shards").glob("*.arrow")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)

    assert proc.returncode == 130, stdout[-2000:] + stderr[-3000:]
    assert "interrupted: the rollouts stored in" in stderr
    stored = len(list(iter_rollouts([out])))
    assert 0 < stored < TASKS * N

    resumed = subprocess.run(rollout_command(tiny_model, out), capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"({stored} already stored)" in " ".join(resumed.stdout.split())
    ids = [row["rollout_id"] for row in iter_rollouts([out])]
    assert len(ids) == TASKS * N and len(set(ids)) == len(ids)
