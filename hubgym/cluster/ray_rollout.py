"""Rollouts on a Ray cluster: one worker per shard, writing what N hand-started workers would write.

    summary = run_on_ray(config, workers=4, address="10.0.0.1:6379")      # config: a RolloutConfig
    hubgym rollout arithmetic --model MODEL --out /shared/runs/r1 --ray --ray-address 10.0.0.1:6379 --workers 4

Worker i is a Ray task that calls run_rollouts with shard_index=i and num_shards=N: the very code path of
`hubgym rollout --shard-index i --num-shards N`, so the run id, the task split, the shard and manifest names and
the resume logic are those of hand-started workers, and so are the guarantees (a run lock per worker, groups
skipped when stored). Each worker owns one vLLM engine and asks Ray for 1 CPU, plus `tensor_parallel_size` GPUs
when the cluster has GPUs. A tp=1 engine runs uniproc (vLLM picks "uni" for world size 1, whatever Ray is
around); a tp>1 engine is told to use multiprocessing, so vLLM never tries to make Ray its own executor from
inside a Ray worker.

What can go wrong, and what the driver does:
- a worker process dies (killed, OOM, node lost): Ray starts the task again (up to `retries` times); the new
  worker resumes the shard from what is stored: nothing sampled twice, nothing lost. One line says so.
- it keeps dying: the run stops with one line naming the worker and the last error; the same command resumes.
- workers wait for resources (a GPU, a node that has not joined yet): one line says how many wait for what,
  and the run goes on when the resources appear.
- a node does not see the run folder (or the model folder): that worker stops before it samples (ray_common's
  probe), and the run stops with one line naming the node, the folder and the fix.
- a worker's own error (a bad env, a parser vLLM does not know): the run stops with that error's line.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from hubgym.cluster.board import BoardListener, ClusterProgress, RunBoard
from hubgym.cluster.ray_common import (ClusterError, Probe, check_probe, cluster_has_gpus, connect, first_line,
                                       node_label, resources_text, write_probe)
from hubgym.errors import HubgymError
from hubgym.rollout.run import RolloutConfig, RunSummary, run_rollouts
from hubgym.rollout.writer import worker_name

WORKER_RETRIES = 3  # restarts of one worker before the run stops
POLL_S = 0.5  # how often the driver redraws the bar and looks at the cluster
WAIT_GRACE_S = 5.0  # workers the cluster has no room for are reported after this long
SLOW_START_S = 120.0  # any worker not started after this long is reported (its room taken by other jobs)
FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM")  # plus every HUBGYM_* and VLLM_*


@dataclass
class ClusterSummary:
    """What the workers of one run did together (the fields of RunSummary, summed)."""

    run_dir: Path
    run_id: str
    workers: int
    written: int
    skipped: int
    shards: list[Path]
    seconds: float
    generated_tokens: int
    restarts: dict[str, int] = field(default_factory=dict)  # worker name -> times Ray started it again


def run_on_ray(config: RolloutConfig, *, workers: int, address: str | None = None,
               retries: int = WORKER_RETRIES, progress: bool = True, console: Any = None) -> ClusterSummary:
    """Sample `config`'s tasks with `workers` Ray workers (one per shard) and wait for all of them.

    Each worker starts its engine with `config.vllm` (a GPU per tensor-parallel rank). Ctrl-C stops every
    worker and raises KeyboardInterrupt: what they stored stays, and the same call resumes."""
    if workers < 1:
        raise ClusterError(f"--workers {workers}: give 1 or more (one Ray worker per shard)")
    ray = connect(address)
    config = replace(config, num_shards=workers, shard_index=0, out=str(Path(config.out).absolute()),
                     mix=str(Path(config.mix).absolute()) if config.mix else None)
    gpus = config.vllm.tensor_parallel_size if config.engine == "vllm" and cluster_has_gpus(ray) else 0
    probe = write_probe(config.out, config.model if config.engine == "vllm" else None)
    board = ray.remote(num_cpus=0)(RunBoard).remote()
    # max_calls=1: a worker process ends with its task, and its engine's memory (a GPU's) goes with it.
    task = ray.remote(max_calls=1)(rollout_worker)
    options = {"num_cpus": 1, "num_gpus": gpus, "max_retries": retries, "retry_exceptions": False,
               "runtime_env": {"env_vars": forwarded_env()}}
    started = time.perf_counter()
    refs = {i: task.options(name=f"hubgym-rollout-{worker_name(i, workers)}", **options).remote(
                replace(config, shard_index=i), probe, board, os.getcwd())
            for i in range(workers)}
    try:
        with ClusterProgress(workers, config.n, enabled=progress, console=console) as bar:
            watch = ClusterWatch(ray, workers, {"CPU": 1, "GPU": gpus}, bar.console.print, retries)
            summaries = wait_for_workers(ray, refs, board, bar, watch)
    finally:
        probe.remove()
    return ClusterSummary(Path(config.out), config.run_id(), workers, sum(s.written for s in summaries),
                          sum(s.skipped for s in summaries), sorted(p for s in summaries for p in s.shards),
                          time.perf_counter() - started, sum(s.generated_tokens for s in summaries),
                          {worker_name(i, workers): a - 1 for i, a in watch.attempts.items() if a > 1})


def rollout_worker(config: RolloutConfig, probe: Probe, board: Any, cwd: str) -> RunSummary:
    """One shard, in a Ray worker: the same run_rollouts call a hand-started worker makes."""
    # Not waited for: a task blocked in ray.get gives its CPU back to Ray, which would start a waiting worker
    # beside it. Actor calls leave this process at once, long before the engine's start could fail.
    board.scheduled.remote(config.shard_index, node_label(), os.getpid())
    check_probe(probe)  # before anything is written: a node that does not see the run folder stops here
    if os.path.isdir(cwd):  # relative env folders resolve as on the driver
        os.chdir(cwd)
    listener = BoardListener(board, config.shard_index, config.n)
    summary = run_rollouts(config, progress=False, listener=listener)
    listener.send()
    return summary


def forwarded_env() -> dict[str, str]:
    """The driver's settings that workers on other nodes need too (hub location, offline mode, vLLM's)."""
    from hubgym.engines.reaper import TOKEN_VAR  # marks the processes of *this* process's engines: never passed on

    return {k: v for k, v in os.environ.items()
            if (k in FORWARDED_ENV or k.startswith(("HUBGYM_", "VLLM_"))) and k != TOKEN_VAR}


class ClusterWatch:
    """Says, one line each, what the bar cannot: workers waiting for resources, nodes joining, restarts."""

    def __init__(self, ray: Any, workers: int, need: dict[str, float], say: Callable[[str], None], retries: int):
        self.ray, self.workers, self.need, self.say, self.retries = ray, workers, need, say, retries
        self.since = time.monotonic()
        self.waiting_said: int | None = None
        self.attempts: dict[int, int] = {}
        self.nodes = self.alive_nodes()
        self.head = ray.get_runtime_context().gcs_address  # what `ray start --address` takes on a new node

    def alive_nodes(self) -> dict[str, str]:
        return {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in self.ray.nodes() if n.get("Alive")}

    def look(self, shards: dict[int, dict[str, Any]], running: int) -> None:
        self.note_restarts(shards)
        nodes = self.alive_nodes()
        for node in nodes.keys() - self.nodes.keys():
            self.say(f"node {nodes[node]} joined the cluster ({len(nodes)} node(s) now)")
        self.nodes = nodes
        unstarted = sum(1 for i in range(self.workers) if not shards.get(i, {}).get("attempts")) if running else 0
        elapsed = time.monotonic() - self.since
        # Waiting for resources: the workers the cluster has no room for (a worker still importing is starting,
        # not waiting), or, past SLOW_START_S, any worker not started (room taken by other jobs).
        waiting = unstarted if elapsed > SLOW_START_S else min(unstarted, max(0, running - self.room()))
        if elapsed < WAIT_GRACE_S:
            return
        if waiting and waiting != self.waiting_said:
            free = resources_text(self.ray.available_resources())
            self.say(f"{waiting} of {self.workers} workers wait for resources (each needs "
                     f"{resources_text(self.need)}; the cluster's {len(nodes)} node(s) have "
                     f"{resources_text(self.ray.cluster_resources())}, {free} free): they start when a node with "
                     f"room joins (`ray start --address {self.head}`) or a running worker ends")
            self.waiting_said = waiting
        elif not unstarted and self.waiting_said:
            self.say(f"all {self.workers} workers have started")
            self.waiting_said = 0

    def room(self) -> int:
        """How many workers the cluster's nodes hold at once, by their total resources."""
        total = self.ray.cluster_resources()
        return min((int(total.get(k, 0) // v) for k, v in self.need.items() if v), default=self.workers)

    def note_restarts(self, shards: dict[int, dict[str, Any]]) -> None:
        for i, entry in shards.items():
            attempts = entry.get("attempts") or 0
            if attempts > self.attempts.get(i, 1):
                self.say(f"worker {worker_name(i, self.workers)} died and Ray started it again on {entry['node']} "
                         f"(restart {attempts - 1} of {self.retries}): it resumes its shard from what it stored")
            self.attempts[i] = max(attempts, self.attempts.get(i, 0))


def wait_for_workers(ray: Any, refs: dict[int, Any], board: Any, bar: ClusterProgress,
                     watch: ClusterWatch) -> list[RunSummary]:
    """Each worker's RunSummary; the first failure cancels the others and raises (see raise_failure)."""
    pending = dict(refs)
    summaries: list[RunSummary] = []
    try:
        while pending:
            ready, _ = ray.wait(list(pending.values()), num_returns=1, timeout=POLL_S)
            shards = ray.get(board.snapshot.remote())
            bar.show(shards)
            watch.look(shards, len(pending))
            for ref in ready:
                shard = next(i for i, r in pending.items() if r == ref)
                del pending[shard]
                try:
                    summaries.append(ray.get(ref))
                except Exception as exc:
                    raise_failure(ray, exc, worker_name(shard, watch.workers), shards.get(shard, {}), watch.retries)
        bar.show(ray.get(board.snapshot.remote()))
    except BaseException:
        for ref in pending.values():  # killed: their locks drop, their vLLM processes die with them
            ray.cancel(ref, force=True)
        settle(ray, list(pending.values()))
        raise
    return summaries


def settle(ray: Any, refs: list[Any], timeout_s: float = 5.0) -> None:
    """Take what cancelled workers ended with (cancelled, or a retry that found the probe gone), so that Ray does
    not print their errors as unhandled when the driver exits: the run's one line stays the only one."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    for ref in ready:
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001 (the run already fails with its own line)
            pass


def raise_failure(ray: Any, exc: Exception, worker: str, entry: dict[str, Any], retries: int) -> None:
    """A worker's own error is raised as itself (one line, as on one machine); a worker that kept dying is one
    ClusterError line; anything else is a bug and keeps its remote traceback."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, HubgymError) or type(cause).__module__.startswith("datasets"):
            raise cause from None
        raise exc
    where = f" on {entry['node']}" if entry.get("node") else ""  # Ray raises this once every retry died too
    raise ClusterError(f"worker {worker} died{where} {retries + 1} time(s) (Ray restarted it {retries} times), so the "
                       f"run stops; last error: {first_line(exc)}. What every worker stored stays; the same command "
                       f"resumes the run", shard=worker,
                       node=entry.get("node")) from None
