"""One writer per run folder part, enforced by the operating system; one run per run folder.

    lock = RunLock(run_dir, "w000of001")     # RunFolderError if another live process holds that part
    claim_run(run_dir, run_id)               # RunFolderError if the folder holds another run's rollouts
    lock.release()

The lock is `fcntl.flock` on `RUN/.lock-<part>`, held while the file stays open: the kernel drops it when the
process ends in any way (SIGKILL included), so a killed run never leaves a stale lock behind and the same
command resumes at once. The file holds the holder's pid, for the message. A part is what one process writes:
a rollout worker (`w000of002`; the N workers of one run lock their own parts and share the folder) or a
trainer's online phase (`online`, held while a step is checked, sampled and written). A second lock on a
held part fails in the same process too (flock locks belong to the open file), so one process never has two
writers of one part either.

The run id is claimed in `RUN/.run-id` under a short lock on `RUN/.lock`, so two runs starting at the same
moment check and claim one after the other; a folder whose manifests name another run is refused as well.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import IO

from hubgym.errors import RunFolderError
from hubgym.files import atomic_write_bytes

CLAIM = ".run-id"


class RunLock:
    """An exclusive lock on one part of a run folder, held until `release` (or the process ends)."""

    def __init__(self, run_dir: str | Path, part: str):
        self.run_dir, self.part = Path(run_dir), part
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / f".lock-{part}"
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(handle)
            handle.close()
            holder = "this process" if pid == os.getpid() else f"process {pid}" if pid else "another process"
            raise RunFolderError(
                f"{self.run_dir} is being written by {holder}: its part {part!r} has one writer at a time. Write "
                f"to another folder (--out), or wait until that process ends; the same command then resumes the run",
                folder=str(self.run_dir), pid=pid) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle: IO[str] | None = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the lock
            self._handle = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_run(run_dir: str | Path, run_id: str) -> None:
    """Record that `run_dir` holds run `run_id`; refuse if it holds (or is claimed by) another run."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _locked(run_dir / ".lock"):
        claim = run_dir / CLAIM
        owners = {claim.read_text().strip()} if claim.exists() else set()
        owners |= {_manifest_run_id(m) for m in run_dir.glob("manifest-*.json")}
        others = sorted(owners - {run_id})
        if others:
            raise RunFolderError(
                f"{run_dir} holds the rollouts of run {others[0]}, and this configuration is run {run_id} (another "
                f"model, envs, sampling, seed, limit or worker count): a run never writes into another run's folder. "
                f"Write to another folder (--out), or use the configuration of run {others[0]} to resume it",
                folder=str(run_dir), run_id=others[0])
        if not owners:
            atomic_write_bytes(claim, f"{run_id}\n".encode())


def _manifest_run_id(path: Path) -> str:
    try:
        return str(json.loads(path.read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"<unreadable {path.name}>"


def _holder(handle: IO[str]) -> int | None:
    handle.seek(0)
    text = handle.read().strip()
    return int(text) if text.isdigit() else None


def _locked(path: Path) -> contextlib.AbstractContextManager[None]:
    """A short exclusive lock (held only while a claim is checked and written; a longer wait names the holder)."""
    from hubgym.files.locks import exclusive

    return exclusive(path, f"the run claim of {path.parent}")
