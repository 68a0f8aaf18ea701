"""`hubgym train` across two nodes: two launcher invocations on this machine (each node one process, LOCAL_RANK 0 on
both), gloo over loopback, the tiny model, 2 offline steps on stored rollouts then 2 online steps sampled by the
one vLLM engine of global rank 0.

- torchrun on each node (`--nnodes 2 --node_rank i`), the `hubgym` script as the program: the straight run.
- DeepSpeed's launcher on each node (`--no_ssh --node_rank i --hostfile H`): node 1's worker dies right after the
  checkpoint of step 1 (tests/train_node.py); node 0 stops with one line, and the same two commands finish the
  run with the straight run's metrics and weights.
- node 1 under bubblewrap with a tmpfs over the run folder's parent (the same path, another, empty, folder): every
  rank stops with one line naming the rank, its host and the folder, before anything is trained or saved.
- a node alone (the other never starts): bounded by dist_timeout_s, one line naming the master and who joined.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from safetensors.torch import load_file

from hubgym.hub.rollouts import iter_rollouts
from hubgym.train.nodes import NONCE_PREFIX, NodeError, check_run_folder_shared, host_name, node_failure
from hubgym.engines.server import free_port
from helpers.scored_runs import make_run

BIN = Path(sys.executable).parent
NODE_SCRIPT = Path(__file__).with_name("train_node.py")
OFFLINE, ONLINE = 2, 2  # steps
LAUNCH_TIMEOUT_S = 300  # a node that hung would fail the test here, not hang it


def train_args(model: Path, rollouts: Path, out: Path, *extra: str) -> list[str]:
    sets = [f"model={model}", f"output_dir={out}", f"offline.sources=[{rollouts}]", f"offline.steps={OFFLINE}",
            f"online.steps={ONLINE}", "eval.limit=0", "checkpoint_every=2", "batch.groups_per_step=2", "grpo.n=2",
            # Well above rank 0's vLLM start on a loaded machine, which the other ranks wait through; a dead peer
            # still breaks the group at once.
            "grpo.zero_variance=keep", "log.every=1000", "dist_timeout_s=600", *extra]
    return ["train", "tiny", *[arg for s in sets for arg in ("--set", s)]]


def torchrun(node: int, port: int, program: list[str]) -> list[str]:
    return [str(BIN / "torchrun"), "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(port), *program]


def deepspeed(node: int, port: int, hostfile: Path, program: list[str]) -> list[str]:
    return [str(BIN / "deepspeed"), "--no_ssh", "--node_rank", str(node), "--hostfile", str(hostfile),
            "--master_addr", "127.0.0.1", "--master_port", str(port), "--no_local_rank", *program]


def run_nodes(commands: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Start every node's command at once (as people start them on their machines); wait for all of them."""
    rendezvous = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen(c, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for c in commands]
    done = []
    try:
        for command, proc in zip(commands, procs):
            out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
            done.append(subprocess.CompletedProcess(command, proc.returncode, out, None))
    finally:
        for proc in procs:  # a node still running here hung: end it with its workers and vLLM's processes
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return done


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("error: ")]


def ok(done: list[subprocess.CompletedProcess]) -> None:
    """Every node exited 0 (else every node's output: the first to fail may be the one that did not report)."""
    assert all(d.returncode == 0 for d in done), "\n".join(
        f"node {node} (exit {d.returncode}):\n{d.stdout[-3000:]}" for node, d in enumerate(done))


def metrics(out: Path) -> list[dict]:
    """Every logged line, wall-clock timings left out (they differ from run to run)."""
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if not k.startswith("time/")} for line in lines]


def online_rows(out: Path) -> dict[str, int]:
    """rollout_id -> policy_version of every stored online rollout; each stored once."""
    rows: dict[str, int] = {}
    for row in iter_rollouts([out / "online"]):
        assert row["rollout_id"] not in rows, f"online rollout {row['rollout_id']} stored twice"
        rows[row["rollout_id"]] = row["provenance"]["policy_version"]
    return rows


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("stored") / "rollouts", "r", groups=12)  # rewards 1 and 0 per group


@pytest.fixture(scope="module")
def straight(tiny_model, rollouts, tmp_path_factory) -> tuple[Path, list[subprocess.CompletedProcess]]:
    """The uninterrupted run: torchrun on each of the two nodes, the `hubgym` script as torchrun's program."""
    root = tmp_path_factory.mktemp("straight")
    out, port = root / "run", free_port()
    program = [str(BIN / "hubgym"), *train_args(tiny_model, rollouts, out)]
    done = run_nodes([torchrun(node, port, program) for node in (0, 1)], cwd=root)
    return out, done


@pytest.mark.slow
def test_two_torchrun_nodes_train_offline_then_online_and_log_each_step_once(straight):
    out, done = straight
    ok(done)
    logged = metrics(out)
    assert [m["step"] for m in logged] == [0, 1, 2, 3]  # rank 0 logs; rank 1 logs nothing
    assert [m["train/phase"] for m in logged] == [0, 0, 1, 1]
    assert all(m["policy/grad_norm"] is not None for m in logged[:OFFLINE])
    for step in ("step-000001", "step-000003"):  # every rank's share of each checkpoint, in the one run folder
        saved = {p.name for p in (out / "checkpoints" / step).iterdir()}
        assert {"client.json", "rng-rank-00000.pt", "rng-rank-00001.pt"} <= saved
        assert json.loads((out / "checkpoints" / step / "client.json").read_text())["world_size"] == 2
    versions = online_rows(out)
    assert len(versions) == ONLINE * 2 * 2  # steps x groups x samples, sampled once (rank 0) and broadcast
    assert sorted(set(versions.values())) == [2, 3]  # the weights synced before each online step
    assert (out / "model" / "model.safetensors").is_file() and not list(out.glob(f"{NONCE_PREFIX}*"))
    assert "model: " in done[0].stdout and "model: " not in done[1].stdout  # the summary is rank 0's


@pytest.mark.slow
def test_a_worker_that_dies_stops_the_other_node_and_the_same_commands_finish_the_run(
        tiny_model, rollouts, straight, tmp_path):
    """DeepSpeed's launcher started on each node with --no_ssh; node 1's worker is SIGKILLed after checkpoint 1."""
    straight_out, _ = straight
    out, hostfile = tmp_path / "run", tmp_path / "hostfile"
    hostfile.write_text("node0 slots=1\nnode1 slots=1\n")
    args = train_args(tiny_model, rollouts, out)
    dying = [str(NODE_SCRIPT), "--die-after-checkpoint", "1", *args]
    port = free_port()
    first = run_nodes([deepspeed(0, port, hostfile, [str(NODE_SCRIPT), *args]), deepspeed(1, port, hostfile, dying)],
                      cwd=tmp_path)
    assert first[0].returncode != 0 and first[1].returncode != 0
    message = errors(first[0])
    assert len(message) == 1 and message[0].startswith(f"error: rank 0 on {host_name()}: the process group broke ("), \
        first[0].stdout[-4000:]
    assert message[0].endswith(f"start every node again with the same command to resume from {out / 'checkpoints'}")
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 1
    assert not (out / "model").exists()

    port = free_port()
    program = [str(BIN / "hubgym"), *args]
    ok(run_nodes([deepspeed(node, port, hostfile, program) for node in (0, 1)], cwd=tmp_path))
    assert metrics(out) == metrics(straight_out)  # each step once, with the values of the uninterrupted run
    assert online_rows(out) == online_rows(straight_out)  # no online rollout lost or stored twice
    a = load_file(str(straight_out / "model" / "model.safetensors"))
    b = load_file(str(out / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.mark.slow
def test_a_run_folder_one_node_cannot_see_stops_every_rank_before_anything_is_trained(tiny_model, rollouts, tmp_path):
    """Node 1 runs under bubblewrap with a tmpfs over the run folder's parent: the same path, an empty folder."""
    runs = tmp_path / "runs"
    runs.mkdir()
    out, port = runs / "run", free_port()
    program = [str(BIN / "hubgym"), *train_args(tiny_model, rollouts, out)]
    hidden = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", str(runs), *torchrun(1, port, program)]
    done = run_nodes([torchrun(0, port, program), hidden], cwd=tmp_path)
    host = host_name()
    expected = (f"error: the run folder {out} is not shared: rank 1 on {host} cannot see the file rank 0 on {host} "
                f"wrote there (every rank writes its part of each checkpoint into it); put output_dir on a "
                f"filesystem every node mounts at the same path (NFS, Lustre, a shared disk) and start every node "
                f"with that output_dir, or train on one node")
    for node, d in enumerate(done):
        assert d.returncode != 0 and errors(d) == [expected], f"node {node}:\n" + d.stdout[-4000:]
    assert list(out.iterdir()) == []  # no checkpoint, no metrics, no nonce left behind


@pytest.mark.slow
def test_a_node_alone_waits_at_most_the_timeout_and_says_who_is_missing(tiny_model, tmp_path):
    """Node 0 started without node 1 (1 of 2 joined), and node 1 without a master: each one line, in 5 s."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=1\nnode1 slots=1\n")
    args = ["train", "tiny", "--set", f"model={tiny_model}", "--set", f"output_dir={tmp_path / 'run'}",
            "--set", "eval.limit=0", "--set", "dist_timeout_s=5"]
    master, missing_master = free_port(), free_port()
    program = [str(BIN / "hubgym"), *args]
    alone, orphan = run_nodes([deepspeed(0, master, hostfile, program),
                               deepspeed(1, missing_master, hostfile, program)], cwd=tmp_path)
    host = host_name()
    assert alone.returncode != 0 and errors(alone) == [
        f"error: rank 0 on {host}: only 1 of 2 processes joined the rendezvous at 127.0.0.1:{master} within 5 s; "
        f"start the missing nodes (same --nnodes, --master_addr and --master_port, each its own --node_rank), or "
        f"raise dist_timeout_s"], alone.stdout[-3000:]
    assert orphan.returncode != 0 and errors(orphan) == [
        f"error: rank 1 on {host}: the master 127.0.0.1:{missing_master} did not answer within 5 s; start node 0 "
        f"there (the node with --node_rank 0), and check that --master_addr and --master_port name it and that the "
        f"port is reachable from {host}"], orphan.stdout[-3000:]


def test_a_broken_process_group_is_one_line_that_says_how_to_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    lost = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
                        "peer [10.0.0.2]:20382. This is typically caused by a remote worker crashing. Check the logs")
    failure = node_failure(lost, timeout_s=1800, output_dir=tmp_path)
    assert isinstance(failure, NodeError) and failure.rank == 3
    assert str(failure) == (f"rank 3 on {host_name()}: the process group broke (Connection closed by peer "
                            f"[10.0.0.2]:20382): another rank died, its node left, or a rank waited more than "
                            f"dist_timeout_s=1800 s; nothing after the last checkpoint is kept: start every node "
                            f"again with the same command to resume from {tmp_path / 'checkpoints'}")
    stalled = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed "
                           "out waiting 3000ms for recv operation to complete")  # what gloo raises past the timeout
    assert "the process group broke (Timed out waiting 3000ms for recv operation to complete): another rank died" \
        in str(node_failure(stalled, timeout_s=3, output_dir=tmp_path))
    nccl = dist.DistBackendError("wait timeout after 1800000ms")
    assert "the process group broke (wait timeout after 1800000ms)" in str(node_failure(nccl, timeout_s=1800,
                                                                                      output_dir=tmp_path))
    assert node_failure(ValueError("a config problem"), timeout_s=1800, output_dir=tmp_path) is None
    assert NodeError("x", rank=1, host="h").__reduce__()[1][2] == {"rank": 1, "host": "h"}  # pickles with its fields


def test_one_process_has_no_folder_to_share(tmp_path):
    check_run_folder_shared(tmp_path / "run")  # no process group: nothing to compare, nothing written
    assert not (tmp_path / "run").exists()


def test_a_rendezvous_timeout_names_the_master_and_how_many_joined(tmp_path, monkeypatch):
    for name, value in {"RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    joined = node_failure(dist.DistStoreError("Timed out after 601 seconds waiting for clients. 3/8 clients joined."),
                          timeout_s=600, output_dir=tmp_path)
    assert str(joined).startswith(f"rank 0 on {host_name()}: only 3 of 8 processes joined the rendezvous at "
                                  f"10.0.0.1:29500 within 600 s; start the missing nodes")
