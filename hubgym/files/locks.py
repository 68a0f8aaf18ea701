"""Locks that die with their holder, and waits that say what they wait for and who holds the lock.

    with exclusive(path, "the SmolLM2 conversion into ~/.cache/hubgym/smollm2-135m-instruct"):
        ...                      # fcntl.flock on `path`: the kernel drops it when the holder ends, SIGKILL included
    with BatonWatch(baton, "DeepSpeed's shm comm op being built"):
        ...                      # torch's build baton: a file a killed build leaves behind, taken over here
    library_lock_notes()         # datasets' cache locks (filelock: flocks) are named when waited on

No lock hubgym or its libraries leave in a cache can outlive its process and stall the next one: hubgym's own
locks and datasets' are flocks, which the kernel releases; torch's extension baton (`<op>/lock`, created
with O_EXCL and deleted when a build ends) is not, so `BatonWatch` deletes one that no live process holds open.
Every wait longer than WAIT_NOTE_S logs one line on the `hubgym.files.locks` logger (printed to stderr when logging
is not configured) naming what it waits for and the holder: its pid and command line, from /proc.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

WAIT_NOTE_S = 3.0  # a wait longer than this says what it waits for
POLL_S = 0.2
LOG = logging.getLogger("hubgym.files.locks")


def describe(pid: int) -> str:
    """`pid 123 (hubgym train tiny)`: a process and its command line (shortened), or `pid 123` if /proc says none."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    line = " ".join(Path(w.decode(errors="replace")).name if i == 0 else w.decode(errors="replace")
                    for i, w in enumerate(words) if w)
    return f"pid {pid} ({line[:120]})" if line else f"pid {pid}"


def flock_holders(path: str | os.PathLike) -> list[int]:
    """Pids holding an flock on the file at `path` (from /proc/locks; empty where it cannot be read)."""
    try:
        info = os.stat(path)
        table = Path("/proc/locks").read_text()
    except OSError:
        return []
    key = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    pids = []
    for line in table.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == key and parts[4].isdigit():
            pids.append(int(parts[4]))
    return sorted(set(pids))


def openers(path: str | os.PathLike) -> list[int]:
    """Pids that hold the file at `path` open (from /proc/<pid>/fd; processes of other users are not seen)."""
    target = os.path.realpath(path)
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
            with fds:
                if any(os.readlink(fd.path) == target for fd in fds):
                    found.append(int(entry.name))
        except OSError:  # the process ended, or is not ours to look at
            continue
    return found


def holders_text(pids: list[int]) -> str:
    return ", ".join(describe(pid) for pid in pids) if pids else "a process this one cannot see"


@contextmanager
def exclusive(path: str | os.PathLike, what: str, note: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `path` for the block (the file is created if needed and left in place). A wait
    longer than WAIT_NOTE_S says once what it waits for and who holds the lock."""
    note = note or LOG.warning
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        started, noted = time.monotonic(), False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not noted and time.monotonic() - started > WAIT_NOTE_S:
                    note(f"waiting for {what}: {path} is locked by {holders_text(flock_holders(path))}; the lock is "
                         f"released when that process ends")
                    noted = True
                time.sleep(POLL_S)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")  # for people; holders are read from /proc/locks
        handle.flush()
        yield


class BatonWatch:
    """While the block runs, a thread watches a lock file that is held by being open (torch's FileBaton): one that
    exists with no process holding it open, twice POLL_S apart, was left by a killed process and is deleted (so a
    waiter goes on); one held longer than WAIT_NOTE_S is named once."""

    def __init__(self, baton: str | os.PathLike, what: str, note: Callable[[str], None] | None = None):
        self.baton, self.what, self.note = Path(baton), what, note or LOG.warning
        self.taken_over = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hubgym-baton-watch", daemon=True)

    def __enter__(self) -> "BatonWatch":
        self.check_once()  # a baton left before this process started is gone before anything waits on it
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def check_once(self) -> None:
        """Delete the baton if no process holds it open now and after POLL_S (the same file both times)."""
        first = _inode(self.baton)
        if first is None or openers(self.baton):
            return
        time.sleep(POLL_S)  # a holder closes the file a moment before deleting it: never take that moment for death
        if _inode(self.baton) == first and not openers(self.baton):
            self._take_over()

    def _take_over(self) -> None:
        try:
            self.baton.unlink()
        except FileNotFoundError:
            return
        self.taken_over = True
        self.note(f"{self.what}: removed {self.baton}, left by a process that was killed while holding it")

    def _watch(self) -> None:
        since, noted, last = None, False, None
        while not self._stop.wait(POLL_S if since is None else 5 * POLL_S):  # /proc is read less while a build runs
            inode = _inode(self.baton)
            if inode is None:
                since, noted, last = None, False, None
                continue
            holders = openers(self.baton)
            if not holders:
                if last == inode:  # held by nobody at two checks in a row: its holder is gone
                    self._take_over()
                    since, noted, last = None, False, None
                else:
                    last = inode
                continue
            last = None
            since = since or time.monotonic()
            if not noted and time.monotonic() - since > WAIT_NOTE_S:
                if holders == [os.getpid()]:  # this process builds it: nothing is waited for
                    self.note(f"building {self.what}")
                else:
                    self.note(f"waiting for {self.what}: {self.baton} is held by {holders_text(holders)}")
                noted = True


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


class _FilelockWaits(logging.Handler):
    """Reads filelock's own debug records ("Lock ... not acquired on FILE, waiting ...") and, once a lock has been
    waited on longer than WAIT_NOTE_S, says which file and who holds it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.waiting: dict[str, float] = {}
        self.noted: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) < 2 or not isinstance(args[1], str):
            return
        path, message = args[1], str(record.msg)
        if "not acquired" not in message:
            if "acquired on" in message or "released" in message:  # ("Attempting to acquire ..." starts each try)
                self.waiting.pop(path, None)
                self.noted.discard(path)
            return
        first = self.waiting.setdefault(path, time.monotonic())
        if path not in self.noted and time.monotonic() - first > WAIT_NOTE_S:
            self.noted.add(path)
            LOG.warning(f"waiting for {path} (a cache lock of datasets or another library): locked by "
                        f"{holders_text(flock_holders(path))}; the lock is released when that process ends")


_WATCHER = _FilelockWaits()


def library_lock_notes() -> None:
    """Name the holder of a library's filelock (datasets' cache locks) that this process waits on longer than
    WAIT_NOTE_S. filelock logs each failed try at DEBUG: its logger is set to DEBUG with a handler that reads
    those records; they do not propagate further, so nothing else is printed."""
    logger = logging.getLogger("filelock")
    if _WATCHER not in logger.handlers:
        logger.addHandler(_WATCHER)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
