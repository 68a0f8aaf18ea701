"""`hubgym rollout --ray` on a real local Ray cluster with real vLLM: a node that joins late, a worker killed
mid-run, and the shards, manifests and run id that two hand-started workers would write; then `hubgym score
--ray` over that run gives what `hubgym score` gives on one machine.

The cluster (tests/helpers/ray_cluster.py) starts with a head that has room for one worker, so the second waits; the
test adds a node once the run says so. One worker is SIGKILLed once its first groups are on disk: Ray starts
it again and it resumes its shard. One long test, because every step needs the vLLM engines already started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

from hubgym.hub.rollouts import iter_rollouts
from hubgym.engines import SamplingArgs
from hubgym.rollout import RolloutConfig
from hubgym.rollout.run import mine
from hubgym.verifiers import arithmetic as arithmetic_verifier

HUBGYM = str(Path(sys.executable).with_name("hubgym"))
TASKS, N, MAX_TOKENS = 24, 4, 256  # 12 groups of long replies a worker, two at a time: well past a first flush
WORKERS = 2


def wait_for(condition, what: str, proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"the run ended while waiting for {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"gave up waiting for {what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def said(log: Path) -> str:
    """What the command printed so far, with every run of whitespace (a wrapped line too) as one space."""
    return " ".join(log.read_text().split())


def manifest_rows(out: Path, worker: str) -> int:
    path = out / f"manifest-{worker}.json"
    return json.loads(path.read_text())["rows"] if path.exists() else 0


def worker_process(out: Path, worker: str) -> psutil.Process:
    """The process that writes `worker`'s part of the run: its run lock file holds its pid."""
    return psutil.Process(int((out / f".lock-{worker}").read_text()))


@pytest.mark.slow
def test_a_ray_run_with_a_late_node_and_a_killed_worker_writes_what_hand_started_workers_write(
        cluster, tiny_model, tmp_path):
    out, log = tmp_path / "run", tmp_path / "log"
    address = cluster.start_head(num_cpus=1)  # room for one worker: the other waits for the node added below
    command = [HUBGYM, "rollout", "arithmetic:medium", "--model", str(tiny_model), "--n", str(N), "--limit",
               str(TASKS), "--set", "concurrency=2", "--set", "flush_every_s=1", "--max-model-len", "1024",
               "--max-tokens", str(MAX_TOKENS), "--out", str(out), "--ray", "--ray-address", address, "--workers",
               str(WORKERS), "--push", "test/rollouts", "--hub", str(tmp_path / "hub")]
    wide = {**os.environ, "COLUMNS": "300"}  # lines and tables unwrapped
    with open(log, "w") as handle:
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, env=wide)
    try:
        wait_for(lambda: "1 of 2 workers wait for resources (each needs 1 CPU" in said(log), "the waiting line",
                 proc, log)
        cluster.add_node(num_cpus=1)
        wait_for(lambda: "all 2 workers have started" in said(log), "the second worker", proc, log)

        victim = "w001of002"  # killed once its first groups are on disk (by time: no shard is full)
        wait_for(lambda: manifest_rows(out, victim) > 0, "a first flush of the victim", proc, log)
        process = worker_process(out, victim)
        assert "ray::" in " ".join(process.cmdline()) and manifest_rows(out, victim) < TASKS * N // 2, process.cmdline()
        os.kill(process.pid, signal.SIGKILL)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = said(log)
    assert proc.returncode == 0, log.read_text()[-4000:] + cluster.logs()
    assert "joined the cluster" in text
    assert f"worker {victim} died and Ray started it again" in text and f"{victim} restarted 1x" in text

    # What two hand-started workers (`--shard-index i --num-shards 2`) write: their run id, files and split.
    run_id = RolloutConfig(envs=["arithmetic:medium"], model=str(tiny_model), out=str(out), n=N, limit=TASKS,
                           sampling=SamplingArgs(temperature=1.0, max_tokens=MAX_TOKENS, seed=0), max_model_len=1024,
                           num_shards=WORKERS).run_id()
    assert text.count(f"run {run_id}: {out}") == 1  # one table for the whole run
    assert sorted(p.name for p in out.glob("manifest-*.json")) == ["manifest-w000of002.json", "manifest-w001of002.json"]
    for i in range(WORKERS):
        worker = f"w{i:03d}of002"
        manifest = json.loads((out / f"manifest-{worker}.json").read_text())
        assert manifest["run_id"] == run_id and manifest["worker"] == worker
        for shard in manifest["shards"]:
            assert shard.startswith(worker)
            tasks = pa.ipc.open_file(out / "shards" / shard).read_all().column("task_id").to_pylist()
            assert all(mine(task, i, WORKERS) for task in tasks)
    ids = [row["rollout_id"] for row in iter_rollouts([out])]
    assert len(ids) == TASKS * N and len(set(ids)) == len(ids)  # nothing lost, nothing twice
    assert f"{TASKS * N} rollouts -> " in text  # --push sent the finished run
    assert not list(out.glob(".cluster-probe-*"))

    # Re-scoring it on the cluster (with a changed verifier shipped to the tasks) = re-scoring it here.
    verifier = tmp_path / "arith_v2.py"
    source = Path(arithmetic_verifier.__file__).read_text()
    assert "formatted: 0.0}" in source
    verifier.write_text(source.replace("formatted: 0.0}", "formatted: 0.5}"))
    here = subprocess.run([HUBGYM, "score", str(out), "--verifier", str(verifier), "--out", str(tmp_path / "on-one")],
                          capture_output=True, text=True, timeout=300, env=wide)
    there = subprocess.run([HUBGYM, "score", str(out), "--verifier", str(verifier), "--out", str(tmp_path / "on-ray"),
                            "--ray", "--ray-address", address], capture_output=True, text=True, timeout=300, env=wide)
    assert here.returncode == 0 and there.returncode == 0, here.stderr[-2000:] + there.stderr[-3000:]
    assert report(here.stdout, tmp_path / "on-one") == report(there.stdout, tmp_path / "on-ray")
    assert "what changed: 0 of" not in here.stdout  # the changed weight did change rewards
    assert rescored(tmp_path / "on-one") == rescored(tmp_path / "on-ray")
    manifests = [json.loads((tmp_path / side / "manifest-w000of001.json").read_text()) for side in ("on-one", "on-ray")]
    assert manifests[0]["rescore"]["counts"] == manifests[1]["rescore"]["counts"]
    assert manifests[0]["shard_files"] == manifests[1]["shard_files"]  # the same bytes, shard by shard


def report(stdout: str, out: Path) -> list[str]:
    """The score command's tables, without the timing in the first title and the output paths."""
    lines = [line.replace(str(out), "OUT") for line in stdout.splitlines()]
    return [line for line in lines if "rows/s" not in line]


def rescored(out: Path) -> list[tuple]:
    rows = []
    for path in sorted((out / "shards").glob("*.arrow")):
        table = pa.ipc.open_file(path).read_all()
        rows += zip(*(table.column(c).to_pylist() for c in ("rollout_id", "reward", "rescore_reward",
                                                              "rescore_metrics", "rescore_error")))
    return rows
