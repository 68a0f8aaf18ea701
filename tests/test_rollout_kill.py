"""Ctrl-C and `kill -9` of `hubgym rollout`, with the real vLLM engine and the tiny model: Ctrl-C stops the run with
a message that says how to resume; after `kill -9` the processes its vLLM engine started die with it and the
groups it finished more than a few seconds before are on disk; the same command then completes the run with no
rollout twice or left out.

The runs also prove vLLM's logging as users see it: the stopped ones, up to the stop (engine started, weights
loaded, groups sampled), show no vLLM line from any of its processes; the resume, with `--verbose`, shows them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

from helpers.engines import ENGINE_PROCESSES, LOADING, VLLM_INFO, VLLM_WARNING
from hubgym.hub.rollouts import iter_rollouts

TASKS, N = 16, 4  # 64 rollouts: fewer than a shard holds, so a shard on disk mid-run was written by time


def wait_for(condition, what: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_the_reaper_kills_every_process_started_in_engine_process_env_when_its_process_is_killed(tmp_path):
    """Marked children and their own children die with the process; a child started outside is left alone."""
    script = textwrap.dedent("""
        import subprocess, sys, time
        from hubgym.engines.reaper import engine_process_env
        sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
        spawner = [sys.executable, "-c", "import subprocess, sys, time; "
                   "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"]
        with engine_process_env():
            marked = [subprocess.Popen(sleep), subprocess.Popen(spawner)]
        unmarked = subprocess.Popen(sleep, start_new_session=True)
        print(" ".join(str(p.pid) for p in marked), unmarked.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    *marked_pids, unmarked_pid = map(int, parent.stdout.readline().split())
    wait_for(lambda: len(psutil.Process(marked_pids[1]).children()) == 1, "the grandchild")
    marked = [psutil.Process(pid) for pid in marked_pids] + psutil.Process(marked_pids[1]).children()
    unmarked = psutil.Process(unmarked_pid)

    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=60)
    _, alive = psutil.wait_procs(marked, timeout=60)

    try:
        assert alive == [] and unmarked.is_running()
    finally:
        for proc in alive + [unmarked]:
            proc.kill()


def command(model: Path, out: Path) -> list[str]:
    return [str(Path(sys.executable).with_name("hubgym")), "rollout", "arithmetic:medium", "--model", str(model),
            "--n", str(N), "--limit", str(TASKS), "--set", "concurrency=2", "--max-model-len", "1024",
            "--max-tokens", "256",  # long replies: the run lasts well past the first time-based flush
            "--set", "flush_every_s=1",  # the first groups reach disk a second after they finish, long before the end
            "--out", str(out)]


def user_env() -> dict[str, str]:
    """The environment of a user's shell: vLLM's engine processes, and no vLLM log level set (this worker's own
    engines may have set one in os.environ)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")}, **ENGINE_PROCESSES}


def stored_rows(out: Path) -> int:
    """Rows in the shard files (each one complete: shards are written atomically), read without the manifest."""
    return sum(pa.ipc.open_file(str(p)).read_all().num_rows for p in (out / "shards").glob("*.arrow"))


def manifest_rows(out: Path) -> int:
    path = out / "manifest-w000of001.json"
    return json.loads(path.read_text())["rows"] if path.exists() else 0


@pytest.mark.slow
def test_ctrl_c_then_sigkill_of_hubgym_rollout_and_the_same_command_completes_the_run(tiny_model, tmp_path):
    """One run stopped twice, as users stop runs: a terminal's Ctrl-C (SIGINT to the whole process group, vLLM's
    processes included), then `kill -9` of hubgym alone; the same command, with `--verbose`, then completes it."""
    out = tmp_path / "run"

    with open(tmp_path / "log-1", "w") as log:
        first = subprocess.Popen(command(tiny_model, out), stdout=log, stderr=log, start_new_session=True,
                                 env=user_env())
    wait_for(lambda: manifest_rows(out) > 0 or first.poll() is not None, "a first flush")
    os.killpg(first.pid, signal.SIGINT)
    first.wait(timeout=300)
    said = (tmp_path / "log-1").read_text()
    assert first.returncode == 130, said[-3000:]
    assert "interrupted: the rollouts stored in" in said
    stopped = stored_rows(out)
    assert 0 < stopped < TASKS * N and stopped % N == 0

    with open(tmp_path / "log-2", "w") as log:
        second = subprocess.Popen(command(tiny_model, out), stdout=log, stderr=log, start_new_session=True,
                                  env=user_env())
    hubgym, descendants = psutil.Process(second.pid), []
    try:
        # Groups finish two at a time; the new ones are on disk after flush_every_s though no shard is full.
        wait_for(lambda: manifest_rows(out) > stopped or second.poll() is not None, "a flush of the second run")
        assert second.poll() is None, (tmp_path / "log-2").read_text()[-3000:]
        flushed = manifest_rows(out)
        engine = [p for p in hubgym.children(recursive=True) if "spawn_main" in " ".join(p.cmdline())
                  or p.name().startswith("VLLM")]
        descendants = hubgym.children(recursive=True)
        assert engine and stopped < flushed < TASKS * N

        os.kill(second.pid, signal.SIGKILL)
        second.wait(timeout=60)
        _, alive = psutil.wait_procs(descendants, timeout=60)
    finally:  # whatever failed, nothing of this test keeps running
        for left in [hubgym, *descendants]:
            with contextlib.suppress(psutil.NoSuchProcess):
                left.kill()
    assert alive == [], [(p.pid, p.cmdline()) for p in alive]
    stored = stored_rows(out)
    assert flushed <= stored < TASKS * N and stored % N == 0  # whole groups only
    for quiet in (said, (tmp_path / "log-2").read_text()):  # the user set no level: no vLLM line in either run
        assert VLLM_INFO.findall(quiet) == [] and VLLM_WARNING.findall(quiet) == [] and LOADING not in quiet, quiet

    # More groups at a time than the stopped runs (concurrency is not part of what a run samples: same run id).
    resumed = subprocess.run([*command(tiny_model, out), "--set", "concurrency=16", "--verbose"], capture_output=True,
                             text=True, timeout=900, env=user_env())

    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"({stored} already stored)" in " ".join(resumed.stdout.split())
    verbose = resumed.stdout + resumed.stderr
    assert {"MainProcess", "EngineCore"} <= set(VLLM_INFO.findall(verbose)) and LOADING in verbose  # both processes
    ids = [row["rollout_id"] for row in iter_rollouts([out])]
    assert len(ids) == TASKS * N and len(set(ids)) == len(ids)
