"""One writer per run folder part, one run per run folder: with real processes holding real OS locks.

A holder process opens a ShardWriter and waits; this process is the second writer. Two runs (another seed) in
one folder, two processes of one worker, a holder killed with SIGKILL, N workers of one run side by side, and
the online trainer's step parts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hubgym.errors import HubgymError, RunFolderError
from hubgym.rollout.run import RolloutConfig, run_rollouts
from hubgym.rollout.runlock import RunLock
from hubgym.rollout.writer import ShardWriter, worker_name

WORKER = worker_name(0, 1)


def hold(run_dir: Path, part: str, run_id: str | None = "run-a") -> subprocess.Popen:
    """A real process that holds `part` of `run_dir` (through ShardWriter, or RunLock when run_id is None) until
    killed; returns once it holds it."""
    opener = (f"ShardWriter({str(run_dir)!r}, {part!r}, run_id={run_id!r})" if run_id
              else f"RunLock({str(run_dir)!r}, {part!r})")
    script = textwrap.dedent(f"""
        import sys
        from hubgym.rollout.runlock import RunLock
        from hubgym.rollout.writer import ShardWriter
        held = {opener}
        print("holding", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


@pytest.mark.slow
def test_a_second_process_on_the_same_part_is_refused_with_the_holders_pid_and_a_sigkill_frees_it(tmp_path):
    holder = hold(tmp_path, WORKER)
    try:
        with pytest.raises(RunFolderError) as refused:
            ShardWriter(tmp_path, WORKER, run_id="run-a")  # the same run: a resume, started twice
    finally:
        kill(holder)

    assert isinstance(refused.value, HubgymError) and refused.value.pid == holder.pid
    assert str(refused.value) == (
        f"{tmp_path} is being written by process {holder.pid}: its part {WORKER!r} has one writer at a time. Write "
        f"to another folder (--out), or wait until that process ends; the same command then resumes the run")
    with ShardWriter(tmp_path, WORKER, run_id="run-a") as resumed:  # the kernel dropped the dead holder's lock
        assert resumed.rows_written == 0


@pytest.mark.slow
def test_another_run_is_refused_in_a_folder_whose_writer_is_alive_or_gone(tmp_path):
    """Two `hubgym rollout` with one --out and another seed: the second must not touch the first's rows."""
    holder = hold(tmp_path, WORKER, run_id="run-a")
    try:
        with pytest.raises(RunFolderError) as refused:
            ShardWriter(tmp_path, worker_name(1, 2), run_id="run-b")  # another part, but another run
    finally:
        kill(holder)
    assert refused.value.run_id == "run-a" and refused.value.pid is None
    assert str(refused.value).startswith(f"{tmp_path} holds the rollouts of run run-a, and this configuration is "
                                         f"run run-b")
    with pytest.raises(RunFolderError, match="holds the rollouts of run run-a"):
        ShardWriter(tmp_path, WORKER, run_id="run-b")  # the writer is gone; its run's folder is still its own
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", f".lock-{WORKER}", ".run-id", "shards"]


def test_a_folder_whose_manifests_name_another_run_is_refused(tmp_path):
    """A folder written before runs were claimed (or an online folder) says whose it is in its manifests."""
    (tmp_path / f"manifest-{WORKER}.json").write_text(json.dumps({"run_id": "run-a", "rows": 0}))

    with pytest.raises(RunFolderError, match="holds the rollouts of run run-a, and this configuration is run run-b"):
        ShardWriter(tmp_path, WORKER, run_id="run-b")
    with ShardWriter(tmp_path, WORKER, run_id="run-a"):  # its own run resumes
        pass


@pytest.mark.slow
def test_workers_of_one_run_share_a_folder_but_not_a_part(tmp_path):
    holder = hold(tmp_path, worker_name(0, 2))
    try:
        with ShardWriter(tmp_path, worker_name(1, 2), run_id="run-a") as other_worker:
            assert other_worker.rows_written == 0
        with pytest.raises(RunFolderError, match=f"process {holder.pid}: its part 'w000of002'"):
            ShardWriter(tmp_path, worker_name(0, 2), run_id="run-a")
    finally:
        kill(holder)


def test_run_rollouts_refuses_another_runs_folder_before_starting_an_engine(tmp_path):
    first = RolloutConfig(envs=["arithmetic:tiny"], model="unused", out=str(tmp_path), limit=2)
    second = RolloutConfig(envs=["arithmetic:tiny"], model="unused", out=str(tmp_path), limit=2,
                           sampling=first.sampling.__class__(seed=1), engine="openai")  # no --base-url: fails later
    ShardWriter(tmp_path, WORKER, run_id=first.run_id()).close()

    with pytest.raises(RunFolderError, match=f"holds the rollouts of run {first.run_id()}, and this configuration "
                                             f"is run {second.run_id()}"):
        run_rollouts(second, progress=False)


@pytest.mark.slow
def test_an_online_step_being_written_by_another_trainer_is_refused(tmp_path):
    from hubgym.engines import SamplingArgs
    from hubgym.train.online import OnlineProducer

    producer = OnlineProducer([("arithmetic:tiny", 1.0)], split="train", model="unused", out_dir=tmp_path, n=2,
                              sampling=SamplingArgs(), max_model_len=256)
    holder = hold(tmp_path, "online", run_id=None)
    try:
        with pytest.raises(RunFolderError, match=f"process {holder.pid}: its part 'online'"):
            producer.produce(None, None, 3, 0, 1)  # refused before it reads, samples or deletes anything
    finally:
        kill(holder)
    with RunLock(tmp_path, "online"):  # free again
        pass
