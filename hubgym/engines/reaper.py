"""vLLM's processes die with the hubgym process that started them, however it ends (SIGKILL included).

    with engine_process_env():   # vLLM started in here: its processes, and theirs, are marked
        llm = vllm.LLM(...)

vLLM runs its engine core (and its workers) in processes of its own. They stop when hubgym closes the
engine or exits normally, but a hubgym killed with SIGKILL runs no clean-up, and they would live on with
parent pid 1, each holding a model's memory. Why not the usual tools:

- PR_SET_PDEATHSIG has to be set inside the child, and vLLM's spawned engine core offers no hook for it
  short of a sitecustomize; it also fires when the *thread* that started the child ends, not the process,
  so an engine restarted from a worker thread would be killed when that thread finishes.
- a watchdog thread in the child needs code in the child for the same reason.

So the watchdog is a tiny process of hubgym's own, one per hubgym process, started the first time an engine
starts: this file run as a script (`python -I`, standard library only), in a session of its own so that a terminal's
Ctrl-C or a kill of hubgym's process group leaves it running. vLLM starts inside `engine_process_env`,
which puts a token unique to this hubgym process into the environment (and the spawn start method, so each
engine process is exec'd with that environment and /proc shows it); every process vLLM's processes start
inherits it. The reaper waits for hubgym to end (a pidfd; polling its parent pid where there is none), then
SIGKILLs every process whose /proc/PID/environ holds the token, until none is left, and exits. After a
normal exit vLLM has usually shut its processes down already and the reaper finds none.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

TOKEN_VAR = "HUBGYM_REAPER_TOKEN"
_started: dict[int, str] = {}  # pid of this process -> its token (a forked child starts its own reaper)


def reaper_token() -> str:
    """This process's token, starting its reaper on first use."""
    pid = os.getpid()
    if pid not in _started:
        token = uuid.uuid4().hex
        subprocess.Popen([sys.executable, "-I", str(Path(__file__).resolve()), str(pid), token],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
        _started[pid] = token
    return _started[pid]


@contextlib.contextmanager
def engine_process_env() -> Iterator[None]:
    """Processes started in here are marked for this process's reaper (and spawned, so the mark shows)."""
    marks = {TOKEN_VAR: reaper_token(), "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    saved = {name: os.environ.get(name) for name in marks}
    os.environ.update(marks)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def marked(token: str) -> list[int]:
    """Pids of the processes whose environment holds `token` (other users' processes cannot be read: skipped)."""
    needle, found = f"{TOKEN_VAR}={token}\0".encode(), []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as handle:
                    if needle in handle.read():
                        found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours
                continue
    return found


def _wait_for_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds here (or the process is gone already)
        while os.getppid() == pid:
            time.sleep(0.2)
        return
    if os.getppid() == pid:  # still our parent once the pidfd is open: it is the right process
        select.select([fd], [], [])  # readable once it has ended
    os.close(fd)


def _reap(token: str) -> None:
    for _ in range(100):  # a process may start another while it is being killed: repeat until none is left
        pids = marked(token)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def main(argv: list[str]) -> None:
    parent, token = int(argv[1]), argv[2]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _wait_for_exit(parent)
    _reap(token)


if __name__ == "__main__":
    main(sys.argv)
