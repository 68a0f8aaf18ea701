"""Run untrusted code (what a model wrote) under bubblewrap, with time, memory and output limits.

    result = run_sandboxed("print(6 * 7)", SandboxConfig(timeout_s=5))
    result.stdout  # "42\\n"

Each run is a fresh `bwrap` sandbox: new pid, network, IPC and UTS namespaces (so no network at
all, not even the host's loopback), a root made only of read-only binds of what the interpreter
needs (/usr, /lib*, the Python prefix and the virtualenv), a private size-capped tmpfs at /tmp
as the working directory, and nothing else of the host: no home directories, no project files,
no /etc beyond the loader cache. A small bootstrap inside the sandbox sets the rlimits (CPU
time, address space, processes, file size), drops to a fresh unprivileged uid (when we run as
root: root ignores RLIMIT_NPROC, so without the drop a fork bomb would not be held back) and
execs the interpreter on the code. When not root, bwrap makes a user namespace instead and the
limits bite on our own uid. rlimits bind each process alone, so the call as a whole (all of its
processes together) is bounded too: by a cgroup of its own where one can be made, else by a
memory watchdog (`hubgym.tools.limits` says which is used when, and why); a call stopped for
memory has `memory_exceeded` set. Output is read with a cap: past `max_output_bytes` the sandbox is
stopped, so a flood costs neither memory nor time. At the wall-clock limit the sandbox's pid 1 is
killed, which takes its whole pid namespace with it (`--die-with-parent` covers our own death).

Without bubblewrap, runs raise `SandboxUnavailableError`, unless unsandboxed runs are allowed
explicitly (`SandboxConfig(allow_unsandboxed=True)` or HUBGYM_ALLOW_UNSANDBOXED=1): then the code
runs in a temporary directory with the same rlimits and timeout but no isolation.
"""

from __future__ import annotations

import functools
import json
import os
import random
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from hubgym.errors import SandboxUnavailableError
from hubgym.tools.limits import BOUNDS, POLL_S, CallBound, open_bound

ALLOW_UNSANDBOXED_ENV = "HUBGYM_ALLOW_UNSANDBOXED"
ALLOW_HINT = (f"accept running model code without isolation (limits and timeout only) with "
              f"SandboxConfig(allow_unsandboxed=True) or {ALLOW_UNSANDBOXED_ENV}=1")
INSTALL_HINT = f"install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`), or {ALLOW_HINT}"
KILL_GRACE_S = 5.0  # how long a killed sandbox may take to tear down its namespace
SANDBOX_PROCS = 2  # processes of bwrap's own in the call (outer bwrap, the namespace's init), beside max_procs
SANDBOX_UIDS = (1_000_000, 2_000_000)  # a fresh uid per run: no other process shares its RLIMIT_NPROC count
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")  # the loader cache and the time zone; not the rest of /etc
ENV = {  # the whole environment of the sandboxed program: nothing of ours leaks in
    "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
    # one thread per math library: threads count against max_procs, and the sandbox is one core's work
    "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
}

# Runs as `python -I -S -c BOOTSTRAP <json>` with the code on stdin, inside the sandbox (cwd /tmp).
BOOTSTRAP = """\
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
code = sys.stdin.buffer.read()
for name, (soft, hard) in cfg["limits"].items():
    resource.setrlimit(getattr(resource, name), (soft, hard))
if cfg["uid"] is not None:
    os.setgroups([]); os.setgid(cfg["uid"]); os.setuid(cfg["uid"])
with open("main.py", "wb") as f:
    f.write(code)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.execv(cfg["python"], [cfg["python"], "main.py"])
"""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one sandboxed run."""

    timeout_s: float = 10.0  # wall clock; then the whole sandbox is killed and timed_out is set
    cpu_s: int = 10  # RLIMIT_CPU: SIGXCPU at the limit, SIGKILL a second later
    memory_mb: int = 1024  # per process (RLIMIT_AS: allocations past it raise MemoryError) and per call, all together
    max_procs: int = 64  # RLIMIT_NPROC (and pids.max with a cgroup): processes and threads the code may have at once
    max_output_bytes: int = 64_000  # stdout + stderr kept; past it the sandbox is stopped, truncated is set
    tmp_mb: int = 64  # size of the private /tmp, and RLIMIT_FSIZE
    allow_unsandboxed: bool = False  # without bubblewrap, run anyway: limits and timeout, but no isolation
    call_bound: str = "auto"  # what bounds the whole call: "cgroup", "watchdog", or "auto" (cgroup where it works)

    def __post_init__(self) -> None:
        if self.call_bound not in BOUNDS:
            raise ValueError(f"SandboxConfig.call_bound={self.call_bound!r} is not one of {', '.join(BOUNDS)}. "
                             f"Fix: use 'auto' (a cgroup where one can be made, else a memory watchdog)")
        for name, least in (("timeout_s", 0.01), ("cpu_s", 1), ("memory_mb", 64), ("max_procs", 1),
                            ("max_output_bytes", 1), ("tmp_mb", 1)):
            value = getattr(self, name)
            if not value >= least:  # also catches NaN
                why = " (the interpreter needs about 64 MB of address space to start)" if name == "memory_mb" else ""
                raise ValueError(f"SandboxConfig.{name}={value!r} is too small: it must be >= {least}{why}. "
                                 f"Fix: raise {name}")


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int  # negative: killed by that signal (as subprocess reports it; sandboxed, exit(128 + N) reads so too)
    timed_out: bool  # killed at config.timeout_s
    truncated: bool  # output passed config.max_output_bytes; the program was stopped there
    memory_exceeded: bool  # the call's processes together passed config.memory_mb; it was stopped
    sandboxed: bool  # False only for an explicitly allowed unsandboxed run
    call_bound: str  # what bounded the whole call: "cgroup v1", "cgroup v2" or "watchdog"
    duration_s: float

    @property
    def signal_name(self) -> str | None:
        """'SIGKILL', 'SIGXCPU', ... when the program was killed by a signal."""
        if self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code).name
        except ValueError:
            return f"signal {-self.exit_code}"


def run_sandboxed(code: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Run `code` as a Python program with sys.executable, isolated and limited by `config`."""
    config = config or SandboxConfig()
    bwrap = shutil.which("bwrap")
    allowed = config.allow_unsandboxed or os.environ.get(ALLOW_UNSANDBOXED_ENV, "").lower() in ("1", "true", "yes")
    if bwrap is None and not allowed:
        raise SandboxUnavailableError(f"running model code needs bubblewrap (`bwrap`), and it is not on PATH. "
                                      f"Fix: {INSTALL_HINT}")
    if bwrap is not None:
        problem = _probe(bwrap)
        if problem and not allowed:
            raise SandboxUnavailableError(f"bubblewrap at {bwrap} cannot create a sandbox here: {problem}. Fix: "
                                          f"run as root or enable unprivileged user namespaces, or {ALLOW_HINT}")
        if not problem:
            return _execute(bwrap, code, config, cwd=None)
    with tempfile.TemporaryDirectory(prefix="hubgym-unsandboxed-") as cwd:
        return _execute(None, code, config, cwd=cwd)


def _python_argv(config: SandboxConfig, uid: int | None) -> list[str]:
    """The bootstrap command: set limits, maybe drop to `uid`, then exec the interpreter on main.py."""
    mb = 1024 * 1024
    limits = {"RLIMIT_CPU": (config.cpu_s, config.cpu_s + 1), "RLIMIT_AS": (config.memory_mb * mb,) * 2,
              "RLIMIT_NPROC": (config.max_procs,) * 2, "RLIMIT_FSIZE": (config.tmp_mb * mb,) * 2,
              "RLIMIT_CORE": (0, 0)}
    python = os.path.normpath(sys.executable)  # "venv/bin/../bin/python" would pass through folders not mounted
    cfg = {"limits": limits, "uid": uid, "python": python}
    return [python, "-I", "-S", "-c", BOOTSTRAP, json.dumps(cfg)]


def _bwrap_argv(bwrap: str, config: SandboxConfig, info_fd: int) -> list[str]:
    """bwrap's flags: namespaces, a read-only root of interpreter binds, a private /tmp, dropped privileges."""
    root = os.geteuid() == 0
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "sandbox", "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
    # As root bwrap keeps every capability: keep only what the bootstrap's uid drop needs (gone after it).
    argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if root else ["--unshare-user"]
    # The private /tmp comes first: an interpreter or virtualenv that lives under /tmp is bound on top of it.
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(config.tmp_mb * 1024 * 1024),
             "--tmpfs", "/tmp"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    binds = [(path, "--ro-bind-try") for path in SYSTEM_FILES] + [(path, "--ro-bind") for path in _interpreter_paths()]
    made: set[str] = set()
    for path, flag in binds:
        for parent in _ancestors(path):  # bwrap would make these 0700: untraversable once we drop to the sandbox uid
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
        argv += [flag, path, path]
    argv += ["--remount-ro", "/", "--chdir", "/tmp"]
    uid = random.randrange(*SANDBOX_UIDS) if root else None
    return argv + _python_argv(config, uid)


def _interpreter_paths() -> list[str]:
    """The Python install and virtualenv, as the host names them and as they really are, minus what /usr covers."""
    candidates = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.normpath(sys.executable))]
    paths: list[str] = []
    for path in candidates + [os.path.realpath(p) for p in candidates]:
        path = os.path.abspath(path)
        covered = any(path == p or path.startswith(p.rstrip("/") + "/") for p in [*SYSTEM_DIRS, *paths])
        if not covered and os.path.isdir(path):
            paths = [p for p in paths if not p.startswith(path + "/")] + [path]
    return paths


def _ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b']."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


@functools.lru_cache(maxsize=4)
def _probe(bwrap: str) -> str | None:
    """Whether bwrap can build our sandbox on this host (once per process): None, or what went wrong."""
    config = SandboxConfig(timeout_s=30)
    try:
        result = _execute(bwrap, "", config, cwd=None)
    except OSError as exc:
        return str(exc)
    if result.exit_code != 0 or result.timed_out:
        return (result.stderr.strip() or f"exit status {result.exit_code}")[:500]
    return None


@dataclass
class _Process:
    """A started run and how to stop all of it."""

    proc: subprocess.Popen
    pidfd: int | None = None  # the sandbox's pid 1 (bwrap's --info-fd names it); None when unsandboxed

    def kill(self) -> None:
        """Stop everything the run started, and return only once it is gone.

        Killing the sandbox's pid 1 makes the kernel kill and reap its whole pid namespace before
        pid 1 is reported dead (its pidfd turns readable), and outer bwrap exits only after that:
        so this waits for the last fork-bomb child. Killing bwrap itself would return first and
        leave the namespace to die a moment later. Also called once the program has ended: outer
        bwrap exits as soon as the main program does, while pid 1 stays to reap what it left
        running (detached children) until bwrap's death reaches it. Unsandboxed, the process
        group is all we can reach.
        """
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                select.select([self.pidfd], [], [], KILL_GRACE_S)
                self.proc.wait(KILL_GRACE_S)
                return
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is not None:  # reaped: its pid (the group's id) may belong to someone else now
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _execute(bwrap: str | None, code: str, config: SandboxConfig, cwd: str | None) -> SandboxResult:
    """Start the bootstrap (under bwrap unless `bwrap` is None), feed it the code, collect its output."""
    start = time.monotonic()
    deadline = start + config.timeout_s
    bound = open_bound(config.call_bound, config.memory_mb * 1024 * 1024, config.max_procs + SANDBOX_PROCS)
    try:
        run = _start(bwrap, config, cwd, deadline, bound)
        with run.proc as proc:  # closes the pipes and waits, however we leave
            try:
                _feed(proc, code)
                outputs, stopped = _collect(run, deadline, config.max_output_bytes, bound)
            finally:
                if proc.poll() is None or run.pidfd is not None:
                    run.kill()
                if run.pidfd is not None:
                    os.close(run.pidfd)
    finally:
        bound.close()  # kills what is left of the call, removes its cgroup
    exit_code = proc.returncode
    if bwrap and 128 < exit_code < 128 + signal.NSIG:  # bwrap reports death by signal N as 128 + N, like a shell
        exit_code = 128 - exit_code
    memory = stopped == "memory" or bound.exceeded()  # also a call whose OOM-killed child it outlived
    return SandboxResult(outputs[0].decode(errors="replace"), outputs[1].decode(errors="replace"), exit_code,
                         stopped == "time", stopped == "output", memory, bwrap is not None, bound.name,
                         time.monotonic() - start)


def _start(bwrap: str | None, config: SandboxConfig, cwd: str | None, deadline: float, bound: CallBound) -> _Process:
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    env = {**ENV, "HOME": cwd or "/tmp", "TMPDIR": cwd or "/tmp"}
    if bwrap is None:
        proc = subprocess.Popen(bound.command(_python_argv(config, uid=None)), cwd=cwd, env=env,
                                start_new_session=True, **pipes)
        bound.started(proc.pid)
        return _Process(proc)
    info_read, info_write = os.pipe()  # bwrap writes {"child-pid": ...} here, then closes it
    try:
        try:
            proc = subprocess.Popen(bound.command(_bwrap_argv(bwrap, config, info_write)), env=env,
                                    start_new_session=True, pass_fds=(info_write,), **pipes)
            bound.started(proc.pid)
        finally:
            os.close(info_write)
        return _Process(proc, _sandbox_pidfd(info_read, deadline))
    finally:
        os.close(info_read)


def _sandbox_pidfd(info_fd: int, deadline: float) -> int | None:
    """A pidfd for the sandbox's pid 1, from bwrap's info JSON; None if bwrap died before writing it."""
    data = b""
    while select.select([info_fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(info_fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return os.pidfd_open(json.loads(data)["child-pid"])
    except (ValueError, KeyError, OSError):  # no info (setup failed), or pid 1 already gone
        return None


def _feed(proc: subprocess.Popen, code: str) -> None:
    """Send the code; the bootstrap reads all of stdin before it prints anything, so this cannot deadlock."""
    try:
        proc.stdin.write(code.encode())
        proc.stdin.close()
    except BrokenPipeError:  # the sandbox died at setup; its stderr says why
        pass


def _collect(run: _Process, deadline: float, cap: int, bound: CallBound) -> tuple[list[bytearray], str | None]:
    """Read stdout and stderr until both close and the program exits, or until it is stopped.

    Returns ([stdout, stderr], why it was stopped: None, "time" at `deadline`, "output" past `cap`
    bytes in all, or "memory" past the call's memory bound).
    """
    proc, outputs, kept = run.proc, [bytearray(), bytearray()], 0
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, 0)
        selector.register(proc.stderr, selectors.EVENT_READ, 1)
        while selector.get_map():
            stop = _stop_reason(deadline, bound)
            if stop:
                run.kill()
                return outputs, stop
            for key, _ in selector.select(min(deadline - time.monotonic(), POLL_S)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                room = cap - kept
                outputs[key.data] += chunk[:room]
                kept += min(len(chunk), room)
                if len(chunk) > room:
                    run.kill()
                    return outputs, "output"
    while proc.poll() is None:  # closed its pipes but keeps running
        stop = _stop_reason(deadline, bound)
        if stop:
            run.kill()
            return outputs, stop
        try:
            proc.wait(min(deadline - time.monotonic(), POLL_S))
        except subprocess.TimeoutExpired:
            pass
    return outputs, None


def _stop_reason(deadline: float, bound: CallBound) -> str | None:
    return "time" if time.monotonic() >= deadline else "memory" if bound.exceeded() else None

