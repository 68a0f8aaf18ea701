"""Training across nodes: the run folder every rank must see, bounded waits, and one line when a node fails.

    rank, world = init_distributed(timeout_s=cfg.dist_timeout_s)   # hubgym.train.engine: bounded rendezvous
    check_run_folder_shared(Path(cfg.output_dir))                  # every rank, before any step or checkpoint
    try:
        ...
    except Exception as exc:                                       # a dead peer or a timeout: one NodeError line
        raise node_failure(exc, timeout_s=cfg.dist_timeout_s, output_dir=cfg.output_dir) or exc

Every rank writes its share of each checkpoint (its optimizer shard, its RNG) into OUT/checkpoints and rank 0
renames the folder into place, so OUT must be one folder that every node sees at the same path (a shared
filesystem). `check_run_folder_shared` proves it at the start: rank 0 writes a fresh nonce file into OUT, and
every rank reads it back after a barrier; a rank on a node with its own local OUT (empty, or left over from
another run) reads nothing or another nonce, and then every rank stops with the same line naming that rank,
its host and the folder, before a weight is loaded or a checkpoint written.

Waits are bounded by `dist_timeout_s` (the process group's timeout: the rendezvous of the DeepSpeed launcher's
workers, and every collective under gloo and NCCL). Ranks other than 0 wait in a collective while rank 0
samples online rollouts or evaluates with vLLM, so it must exceed the longest of those (default 30 minutes,
torch's own default). torchrun's agents rendezvous before hubgym starts: `--rdzv-conf timeout=S` bounds
that wait (torch's default: 600 s).

Nothing here assumes that LOCAL_RANK 0 is global rank 0 or that one node holds every rank: the vLLM engine,
metrics, online rollouts, evaluation and the export belong to global rank 0; each node resolves the model
itself (the tiny model under a lock: every rank of a node resolves it); DeepSpeed broadcasts rank 0's initial
weights. A dead worker ends the run on every node; the same commands resume it from the last checkpoint
(torchrun's `--rdzv-backend c10d --max-restarts K` does that by itself, K times).
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from pathlib import Path

from hubgym.errors import NodeError
from hubgym.files import atomic_write_bytes

NONCE_PREFIX = ".hubgym-nodes-"  # + the nonce: rank 0 writes it at the start; removed once every rank has read it
SHARED_FS_FIX = ("put output_dir on a filesystem every node mounts at the same path (NFS, Lustre, a shared "
                 "disk) and start every node with that output_dir, or train on one node")


def host_name() -> str:
    """The node's name as people know it (what torchrun's failure summary calls `host`)."""
    return socket.gethostname()


def check_run_folder_shared(folder: Path) -> None:
    """Raise NodeError on every rank if any rank cannot see what rank 0 writes into `folder` (call on every rank).

    The nonce is new each run and compared by value, so a stale copy of OUT on a node's local disk fails too. It is
    also the file's name: a name no node has looked up before cannot be answered from a network filesystem's
    cache of earlier lookups (NFS caches "no such file" answers for a few seconds).
    """
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    box = [secrets.token_hex(16) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    nonce = box[0]
    path = Path(folder) / f"{NONCE_PREFIX}{nonce}"
    if rank == 0:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for left in Path(folder).glob(f"{NONCE_PREFIX}*"):  # a killed run's
            left.unlink(missing_ok=True)
        atomic_write_bytes(path, nonce.encode())
    dist.barrier()
    seen = _read_text(path) == nonce
    views: list = [None] * world
    dist.all_gather_object(views, (rank, host_name(), seen))
    if rank == 0:
        path.unlink(missing_ok=True)
    blind = [(r, host) for r, host, ok in views if not ok]
    if blind:
        who = ", ".join(f"rank {r} on {host}" for r, host in blind)
        raise NodeError(f"the run folder {folder} is not shared: {who} cannot see the file rank 0 on {views[0][1]} "
                        f"wrote there (every rank writes its part of each checkpoint into it); {SHARED_FS_FIX}",
                        rank=blind[0][0], host=blind[0][1])


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


_JOINED = re.compile(r"(\d+)/(\d+) clients joined")
_CONNECT = re.compile(r"trying to connect to \(([^,]+), (\d+)\)")


def node_failure(exc: BaseException, *, timeout_s: float, output_dir: str | Path) -> NodeError | None:
    """The one-line NodeError for a rendezvous that timed out or a process group that broke (a peer died, a
    node left, a rank stalled past the timeout); None for any other exception."""
    import torch.distributed as dist

    if not isinstance(exc, dist.DistError) and not _gloo_peer_lost(exc):
        return None
    rank, host = int(os.environ.get("RANK", "0")), host_name()
    master = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    text = _first_sentence(str(exc)) or type(exc).__name__
    here = f"rank {rank} on {host}"
    joined, connect = _JOINED.search(str(exc)), _CONNECT.search(str(exc))
    if joined:
        return NodeError(f"{here}: only {joined[1]} of {joined[2]} processes joined the rendezvous at {master} "
                         f"within {timeout_s:g} s; start the missing nodes (same --nnodes, --master_addr and "
                         f"--master_port, each its own --node_rank), or raise dist_timeout_s", rank=rank, host=host)
    if connect:
        return NodeError(f"{here}: the master {connect[1]}:{connect[2]} did not answer within {timeout_s:g} s; start "
                         f"node 0 there (the node with --node_rank 0), and check that --master_addr and "
                         f"--master_port name it and that the port is reachable from {host}", rank=rank, host=host)
    return NodeError(f"{here}: the process group broke ({text}): another rank died, "
                     f"its node left, or a rank waited more than dist_timeout_s={timeout_s:g} s; nothing after "
                     f"the last checkpoint is kept: start every node again with the same command to resume from "
                     f"{Path(output_dir) / 'checkpoints'}", rank=rank, host=host)


def _first_sentence(message: str) -> str:
    """"[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:20382. This is typically..." ->
    "Connection closed by peer [10.0.0.2]:20382": the cause, without the source location and the advice."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    line = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", line)
    return line.split(". ")[0].rstrip(".")[:200]


def _gloo_peer_lost(exc: BaseException) -> bool:
    """Gloo reports a peer that closed its sockets as a plain RuntimeError (older torch) naming gloo."""
    return isinstance(exc, RuntimeError) and "gloo" in str(exc).lower() and (
        "connection closed by peer" in str(exc).lower() or "timed out" in str(exc).lower()
        or "connection reset" in str(exc).lower())
