"""A Ray cluster of this test's own on 127.0.0.1: a head and nodes that join later, stopped by process group.

    cluster = LocalRayCluster()
    address = cluster.start_head(num_cpus=1)          # HOST:PORT, a free port
    cluster.add_node(num_cpus=1)                      # joins the head (optionally under a wrapper: bwrap ...)
    cluster.stop()                                    # only this cluster's processes: never a global `ray stop`

Each `ray start --block` runs in a session of its own, with a temp dir of its own (short: Ray's unix socket
paths must fit 107 bytes) and free ports for every server it opens, so it never meets another cluster on
the machine. Stopping kills each of those sessions and every process under them, by process id.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from hubgym.engines.server import free_ports

RAY = str(Path(sys.executable).with_name("ray"))
PORT_OPTIONS = ("--node-manager-port", "--object-manager-port", "--metrics-export-port", "--runtime-env-agent-port",
                "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port")


class LocalRayCluster:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        # Token authentication off unless asked for: a ~/.ray/auth_token left by any local `ray.init()` would
        # otherwise turn it on for `ray start` (and only for it), whatever machine the tests run on.
        self.env = {"RAY_AUTH_MODE": "disabled", **(env or {})}
        self.root = Path(tempfile.mkdtemp(prefix="hgray"))
        self.nodes: list[tuple[subprocess.Popen, Path]] = []
        self.address: str | None = None

    def start_head(self, num_cpus: int) -> str:
        port, client, *ports = free_ports(2 + len(PORT_OPTIONS))
        self.address = f"127.0.0.1:{port}"
        self._start(["--head", "--port", str(port), "--ray-client-server-port", str(client),
                     "--include-dashboard", "false", "--temp-dir", str(self.root / "t")], num_cpus, ports)
        return self.address

    def add_node(self, num_cpus: int, wrapper: list[str] | None = None) -> None:
        assert self.address, "start the head first"
        self._start(["--address", self.address], num_cpus, free_ports(len(PORT_OPTIONS)), wrapper or [])

    def _start(self, args: list[str], num_cpus: int, free: list[int], wrapper: list[str] | None = None) -> None:
        ports = [arg for option, port in zip(PORT_OPTIONS, free) for arg in (option, str(port))]
        log = self.root / f"node{len(self.nodes)}.log"
        command = [*(wrapper or []), RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus",
                   str(num_cpus), "--num-gpus", "0", "--disable-usage-stats", "--object-store-memory",
                   str(80 << 20), *ports, *args]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **self.env}
        env.pop("RAY_ADDRESS", None)
        with open(log, "w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.nodes.append((proc, log))
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGKILL each of our `ray start` sessions and every process under them (a test cluster keeps nothing)."""
        procs = []
        for proc, _ in self.nodes:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs += [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for left in procs:  # workers and engines that left the session
            with contextlib.suppress(psutil.NoSuchProcess):
                left.kill()
        psutil.wait_procs(procs, timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(log.read_text()[-2000:] for _, log in self.nodes)
