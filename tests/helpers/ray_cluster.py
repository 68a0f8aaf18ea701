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
# Ray's own start gives up when its raylet has not registered within a fixed 30 s (ray/_private/node.py): on a
# loaded machine that is slowness, not failure, so such a start is tried again, for this long in all.
RAY_START_TOO_EARLY = "The current node timed out during startup"
START_DEADLINE_S = 600.0


class LocalRayCluster:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        # Token authentication off unless asked for: a ~/.ray/auth_token left by any local `ray.init()` would
        # otherwise turn it on for `ray start` (and only for it), whatever machine the tests run on.
        self.env = {"RAY_AUTH_MODE": "disabled", **(env or {})}
        self.root = Path(tempfile.mkdtemp(prefix="hgray"))
        self.nodes: list[tuple[subprocess.Popen, Path]] = []
        self.launched = 0  # `ray start`s so far, tries that gave up included: names each one's log and temp dir
        self.address: str | None = None

    def start_head(self, num_cpus: int) -> str:
        def args(port: int, client: int) -> list[str]:
            self.address = f"127.0.0.1:{port}"
            return ["--head", "--port", str(port), "--ray-client-server-port", str(client), "--include-dashboard",
                    "false", "--temp-dir", str(self.root / f"t{self.launched}")]

        self._start(args, num_cpus, own_ports=2)
        return self.address

    def add_node(self, num_cpus: int, wrapper: list[str] | None = None) -> None:
        assert self.address, "start the head first"
        self._start(lambda: ["--address", self.address], num_cpus, wrapper=wrapper or [])

    def _start(self, args, num_cpus: int, wrapper: list[str] | None = None, own_ports: int = 0) -> None:
        """Start a node, trying again while Ray's own start gives up too early.

        `ray start` waits a fixed 30 s for its raylet to register with the GCS ("The current node timed out during
        startup"), which a machine busy with other work can exceed; that is the machine's speed, not a failure of
        what the test checks. So such a try is killed with everything it started and the node started again on
        fresh ports, until START_DEADLINE_S; any other failure, or the deadline, raises with the node's log.
        `args(*ports)` gives the node's own options, taking `own_ports` of the fresh ports.
        """
        deadline, tries = time.monotonic() + START_DEADLINE_S, 0
        while True:
            tries += 1
            ports = free_ports(own_ports + len(PORT_OPTIONS))  # all different, fresh for every try
            proc, log = self._launch(args(*ports[:own_ports]), ports[own_ports:], num_cpus, wrapper)
            while "Ray runtime started" not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            else:
                self.nodes.append((proc, log))
                return
            exited, text = proc.poll() is not None, log.read_text()
            self._kill([proc])
            if not exited or RAY_START_TOO_EARLY not in text or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed (try {tries}, {START_DEADLINE_S:.0f} s allowed):\n{text[-3000:]}")

    def _launch(self, args: list[str], free: list[int], num_cpus: int,
                wrapper: list[str] | None) -> tuple[subprocess.Popen, Path]:
        ports = [arg for option, port in zip(PORT_OPTIONS, free) for arg in (option, str(port))]
        log = self.root / f"node{self.launched}.log"
        self.launched += 1
        command = [*(wrapper or []), RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus",
                   str(num_cpus), "--num-gpus", "0", "--disable-usage-stats", "--object-store-memory",
                   str(80 << 20), *ports, *args]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **self.env}
        env.pop("RAY_ADDRESS", None)
        with open(log, "w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return proc, log

    def stop(self) -> None:
        """SIGKILL each of our `ray start` sessions and every process under them (a test cluster keeps nothing)."""
        self._kill([proc for proc, _ in self.nodes])
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def _kill(sessions: list[subprocess.Popen]) -> None:
        procs = []
        for proc in sessions:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs += [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for left in procs:  # workers and engines that left the session
            with contextlib.suppress(psutil.NoSuchProcess):
                left.kill()
        psutil.wait_procs(procs, timeout=30)
        for proc in sessions:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def logs(self) -> str:
        return "\n".join(log.read_text()[-2000:] for _, log in self.nodes)
