"""What rollouts and re-scoring on a Ray cluster share: importing Ray, connecting, and the run-folder probe.

    ray = import_ray()                         # ClusterError naming `pip install 'hubgym[ray]'` if missing
    connect("10.0.0.1:6379")                   # one ClusterError line within ~30 s if nothing answers there
    probe = write_probe("runs/r1")             # the driver, before any rollout
    check_probe(probe)                         # each worker: it must read the same nonce at the same path

Ray is imported only here, and only when a command is given `--ray`: `import hubgym` never loads it.

Why a probe: a worker writes its shards into the run folder *on its own node*. When that folder is not on a
filesystem every node mounts at the same path, the shards land on disks no one reads, and a later run resumes
nothing. The driver writes a file with a random nonce into the run folder; a worker that does not read that
nonce at that path stops before it samples anything, with one line naming its node and the folder.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from hubgym.errors import ClusterError
from hubgym.files import atomic_write_bytes

INSTALL_HINT = "pip install 'hubgym[ray]'"
CONNECT_TIMEOUT_S = 30.0  # an address that does not answer within this is reported, not waited on
PROBE_PREFIX = ".cluster-probe-"


def import_ray() -> ModuleType:
    """The `ray` module; a ClusterError with the install line when it is not installed."""
    try:
        import ray
    except ImportError:
        raise ClusterError(f"--ray needs Ray, which is not installed here: {INSTALL_HINT} (the same Ray version on "
                           f"every node of the cluster)") from None
    return ray


def connect(address: str | None, *, timeout_s: float = CONNECT_TIMEOUT_S) -> ModuleType:
    """ray.init: `None` is Ray's default (RAY_ADDRESS, else a local cluster started for this run), `auto` finds a
    cluster started on this machine, `HOST:PORT` is a cluster's head. An address that does not answer is one
    ClusterError line within about `timeout_s` (ray.init itself would retry for minutes)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    target = address or os.environ.get("RAY_ADDRESS") or None
    if target and target not in ("auto", "local") and not target.startswith("ray://"):
        check_answers(target, timeout_s)
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=True,
                 include_dashboard=False if address is None and target is None else None)
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
        shown = address or target or "auto"
        if auth_refused(f"{type(exc).__name__}: {exc}"):
            raise ClusterError(token_refused(shown), address=shown) from None
        raise ClusterError(f"cannot connect to the Ray cluster at {shown}: {first_line(exc)}; check it with "
                           f"`ray status --address {shown}` (on the head node: `ray start --head` starts one)",
                           address=shown) from None
    return ray


def check_answers(address: str, timeout_s: float) -> None:
    """Refuse a HOST:PORT where no Ray head answers: nothing listening, or something that is not Ray's GCS.

    The GCS question runs in a child process: Ray's client retries (and logs to stderr) far past any timeout we
    could pass it, and a child is the one thing that can be stopped on time and kept quiet."""
    host, _, port = address.rpartition(":")
    fix = f"check it with `ray status --address {address}` (on the head node: `ray start --head --port {port or 6379}`)"
    if not host or not port.isdigit():
        raise ClusterError(f"--ray-address {address!r} is not HOST:PORT (or 'auto'); e.g. 10.0.0.1:6379, the "
                           f"address `ray start --head` prints", address=address)
    try:
        socket.create_connection((host, int(port)), timeout=min(timeout_s, 10.0)).close()
    except OSError as exc:
        raise ClusterError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); {fix}",
                           address=address) from None
    probe = ("import sys, ray._raylet as r; c = r.GcsClient(address=sys.argv[1]); "
             "c.internal_kv_get(b'session_name', namespace=b'session', timeout=5)")
    try:
        done = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"something listens at {address} but no Ray cluster answered within {timeout_s:.0f} s; "
                           f"{fix}", address=address) from None
    if done.returncode != 0:
        if auth_refused(done.stderr.decode(errors="replace")):
            raise ClusterError(token_refused(address), address=address)
        raise ClusterError(f"no Ray cluster answers at {address} ({last_line(done.stderr)}); {fix}", address=address)


def auth_refused(text: str) -> bool:
    return "InvalidAuthToken" in text or "AuthenticationError" in text


def token_refused(address: str) -> str:
    """Ray's token authentication: a head started where ~/.ray/auth_token exists (a local `ray.init()` writes one)
    wants the token, and a client given an explicit address sends it only with RAY_AUTH_MODE=token."""
    return (f"the Ray cluster at {address} asks for an authentication token and this process sent none it accepts: "
            f"set RAY_AUTH_MODE=token here, with the head's token in RAY_AUTH_TOKEN or ~/.ray/auth_token "
            f"(or start the head with RAY_AUTH_MODE=disabled)")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no answer"


def cluster_has_gpus(ray: ModuleType) -> bool:
    return ray.cluster_resources().get("GPU", 0) > 0


def node_label() -> str:
    """This process's node as people name it: hostname and IP."""
    host = socket.gethostname()
    try:
        import ray

        ip = ray.util.get_node_ip_address()
    except Exception:  # not in a Ray process: the hostname says enough
        return host
    return f"{host} ({ip})"


@dataclass(frozen=True)
class Probe:
    """A file the driver wrote into the run folder; a worker that sees the folder reads the same nonce."""

    run_dir: str  # absolute, as the driver sees it
    path: str
    nonce: str
    driver: str  # the driver's node label, for the message
    model: str | None = None  # a model folder the workers load, checked the same way (None: not a folder)

    def remove(self) -> None:
        Path(self.path).unlink(missing_ok=True)


def write_probe(run_dir: str | Path, model: str | None = None) -> Probe:
    """Write the probe file (atomically) into `run_dir`, made absolute; creates the folder."""
    folder = Path(run_dir).absolute()
    nonce = uuid.uuid4().hex
    path = folder / f"{PROBE_PREFIX}{nonce}.json"
    driver = node_label()
    atomic_write_bytes(path, json.dumps({"nonce": nonce, "driver": driver}).encode())
    model = str(Path(model).absolute()) if model and Path(model).is_dir() else None
    return Probe(str(folder), str(path), nonce, driver, model)


def check_probe(probe: Probe) -> None:
    """In a worker: refuse to run on a node that does not see the driver's run folder (or model folder)."""
    node = node_label()
    if read_nonce(Path(probe.path)) != probe.nonce:
        raise ClusterError(
            f"node {node} does not see the run folder {probe.run_dir} that the driver on {probe.driver} writes (a "
            f"probe file the driver wrote there is not on this node), so its shards would land on a disk no other "
            f"node reads. Put the run folder on a filesystem every node mounts at the same path (NFS, a cluster "
            f"filesystem) and give that path as --out; re-running then resumes the run", node=node)
    if probe.model is not None and not Path(probe.model).is_dir():
        raise ClusterError(
            f"node {node} does not see the model folder {probe.model} that the driver on {probe.driver} loads; put "
            f"the model on a filesystem every node mounts at the same path (or in each node's Hugging Face cache "
            f"at that path) and give that folder as --model", node=node)


def read_nonce(path: Path) -> str | None:
    try:
        return str(json.loads(path.read_text())["nonce"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resources_text(resources: dict[str, Any]) -> str:
    """{'CPU': 1.0, 'GPU': 1.0} -> '1 CPU, 1 GPU' (only the resources people ask for)."""
    shown = [(k, v) for k, v in sorted(resources.items()) if k in ("CPU", "GPU") and v]
    return ", ".join(f"{v:g} {k}" for k, v in shown) or "nothing"
