"""Limits on a whole sandboxed call: all of its processes together, not each one alone.

rlimits bind one process each: with RLIMIT_AS at 1 GB, one call held four children of 700 MB.
Each call is bounded as a whole by one of two mechanisms (`SandboxConfig.call_bound`; "auto"
takes the first that works):

cgroup (the real mechanism: we are root, or own a delegated cgroup tree, and the cgroup
filesystem is writable). Each call gets a fresh cgroup: made with mkdir under a unique name and
given its limits (memory.limit_in_bytes or memory.max, the same bound on memory plus swap, and
pids.max) before any process is in it. The sandbox is started inside it: a shell writes its own
pid into the cgroup, then execs bwrap, so every process of the call is counted from its first
page and none can leave. The kernel enforces the bound; past it, its OOM killer picks a process
of this call only, and we then stop the whole sandbox (the cgroup's oom_kill count is polled), so
the call reports memory rather than one stray SIGKILL. Afterwards whatever is left in the cgroup
is killed and the cgroup removed. With cgroup v1 (a `memory` hierarchy, as on this kind of VM)
the call's cgroup nests under our own, so our own limits still apply to it; with cgroup v2 it
sits under the hierarchy's root, the one cgroup that may both hold processes and hand memory
and pids down to children (delegation elsewhere fails here, and "auto" moves on).

watchdog (no usable cgroups: not root, a read-only cgroupfs, controllers not delegated). Every
POLL_S it sums the proportional set size (PSS: a shared page is split among its users, so forked
children that share the interpreter are not counted once each) of every process of the call and
stops the whole sandbox past the limit. The call's processes are the descendants of the first
one (in the sandbox's pid namespace orphans are re-parented to its pid 1, so they stay in that
tree) and, unsandboxed, its session. It can overshoot by what the call allocates within one poll,
and it does not see files in the private /tmp (capped by `tmp_mb` anyway).

In both, RLIMIT_AS per process (set by the sandbox's bootstrap) stays as a second line: a single
allocation past the limit fails at once with MemoryError.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import secrets
import signal
import time

from hubgym.errors import SandboxUnavailableError

POLL_S = 0.05  # how often a running call's memory is checked
CLEANUP_S = 5.0  # how long removing a call's cgroup may wait for its last processes to die
BOUNDS = ("auto", "cgroup", "watchdog")
# Writes its own pid into each cgroup.procs given before "--", then execs the rest: placed before bwrap starts.
ENTER_CGROUP = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
logger = logging.getLogger(__name__)


class CallBound:
    """What bounds one call; `command` wraps its argv, `exceeded` is polled, `close` cleans up."""

    name = ""

    def command(self, argv: list[str]) -> list[str]:
        return argv

    def started(self, pid: int) -> None:
        """The call's first process (bwrap, or the unsandboxed interpreter) is `pid`."""

    def exceeded(self) -> bool:
        """Whether the call has passed its memory bound (checked at most every POLL_S; sticky)."""
        return False

    def close(self) -> None:
        """Kill whatever of the call is left and release what the bound holds; `exceeded` keeps its answer."""


def open_bound(kind: str, memory_bytes: int, max_pids: int) -> CallBound:
    """A fresh bound for one call: a cgroup where one can be made (`kind` "auto" or "cgroup"), else a watchdog."""
    if kind == "watchdog":
        return Watchdog(memory_bytes)
    layout, reason = cgroup_layout()
    if layout is not None:
        try:
            return Cgroup(layout, memory_bytes, max_pids)
        except OSError as exc:
            reason = f"making a cgroup under {layout[1]} failed: {exc}"
    if kind == "cgroup":
        raise SandboxUnavailableError(
            f"SandboxConfig(call_bound='cgroup') needs a cgroup with the memory controller that we may create, "
            f"and {reason}. Fix: run as root with the cgroup filesystem mounted read-write, or use "
            f"call_bound='auto', which falls back to a memory watchdog")
    _warn_once(reason)
    return Watchdog(memory_bytes)


@functools.lru_cache(maxsize=1)
def _warn_once(reason: str) -> None:
    logger.warning("sandbox: cannot bound calls with a cgroup (%s); a memory watchdog bounds them instead", reason)


class Cgroup(CallBound):
    """One cgroup per call (in each hierarchy that holds memory or pids), removed by `close`."""

    def __init__(self, layout: tuple, memory_bytes: int, max_pids: int):
        version, memory_parent, pids_parent = layout
        self.name, self.dirs = f"cgroup v{version}", []
        self._last_check, self._over = 0.0, False
        # (parent, [(file, value)]); a file named with a trailing "?" is written only where the kernel has it
        # (swap accounting, memory.oom.group, a pids controller handed down)
        if version == 1:
            plan = [(memory_parent, [("memory.limit_in_bytes", memory_bytes),
                                     ("memory.memsw.limit_in_bytes?", memory_bytes)])]  # memory + swap
            plan += [(pids_parent, [("pids.max", max_pids)])] if pids_parent else []
            self.counter = ("memory.oom_control", "oom_kill")
        else:
            plan = [(memory_parent, [("memory.max", memory_bytes), ("memory.swap.max?", 0),
                                     ("memory.oom.group?", 1), ("pids.max?", max_pids)])]
            self.counter = ("memory.events", "oom_kill")
        leaf = f"hubgym-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            for parent, settings in plan:
                path = os.path.join(parent, leaf)
                os.mkdir(path, 0o755)  # fails if the name exists: nobody else's cgroup is ever reused
                self.dirs.append(path)
                for name, value in settings:
                    file = os.path.join(path, name.rstrip("?"))
                    if not name.endswith("?") or os.path.exists(file):
                        _write(file, value)
        except OSError:
            self.close()
            raise

    def command(self, argv: list[str]) -> list[str]:
        return ["/bin/sh", "-c", ENTER_CGROUP, "sh", *[os.path.join(d, "cgroup.procs") for d in self.dirs], "--", *argv]

    def exceeded(self) -> bool:
        now = time.monotonic()
        if self._over or now - self._last_check < POLL_S or not self.dirs:
            return self._over
        self._last_check = now
        file, key = self.counter
        try:
            with open(os.path.join(self.dirs[0], file)) as f:
                counts = dict(line.split() for line in f if line.strip())
        except OSError:
            return self._over
        self._over = int(counts.get(key, 0)) > 0
        return self._over

    def close(self) -> None:
        self._last_check = 0.0
        self.exceeded()  # the final count, before the cgroup and its counter go
        for path in reversed(self.dirs):
            if not _empty_and_remove(path):
                logger.warning("sandbox: could not remove the call's cgroup %s: processes in it would not die", path)
        self.dirs = []


def _write(path: str, value: int) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _empty_and_remove(path: str) -> bool:
    """SIGKILL every process left in the cgroup at `path` until it is empty, then rmdir it."""
    deadline = time.monotonic() + CLEANUP_S
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY: processes are still in it (or were a moment ago)
            if time.monotonic() > deadline:
                return False
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(line) for line in f if line.strip()]
        except OSError:
            pids = []
        for pid in pids:  # bounded by pids.max, so this converges even against a fork loop
            _kill(pid)
        time.sleep(0.01)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@functools.lru_cache(maxsize=1)
def cgroup_layout() -> tuple[tuple | None, str]:
    """((version, memory parent dir, pids parent dir or None), "") where call cgroups can be made, else (None, why).

    Looked up once per process from /proc/self/mountinfo and /proc/self/cgroup.
    """
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [_mount(line) for line in f]
        with open("/proc/self/cgroup") as f:
            own = {ctrl: path for _, ctrls, path in (line.rstrip("\n").split(":", 2) for line in f)
                   for ctrl in ctrls.split(",")}
    except OSError as exc:
        return None, f"the cgroup tables cannot be read ({exc})"
    v1 = {c: _own_dir(m, own.get(c)) for m in mounts if m["type"] == "cgroup" for c in ("memory", "pids")
          if c in m["super"]}
    if "memory" in v1:
        memory, pids = v1["memory"], v1.get("pids")
        problem = _unwritable(memory)
        return (None, problem) if problem else ((1, memory, pids if pids and not _unwritable(pids) else None), "")
    roots = [m["point"] for m in mounts if m["type"] == "cgroup2"]
    if not roots:
        return None, "no cgroup filesystem with the memory controller is mounted"
    return _v2_layout(roots[0])


def _v2_layout(root: str) -> tuple[tuple | None, str]:
    """cgroup v2: call cgroups go right under the hierarchy's root, which must hand memory (and pids) down."""
    try:
        with open(os.path.join(root, "cgroup.controllers")) as f:
            available = f.read().split()
        if "memory" not in available:
            return None, f"the memory controller is not available in {root}"
        with open(os.path.join(root, "cgroup.subtree_control")) as f:
            enabled = f.read().split()
        missing = [c for c in ("memory", "pids") if c in available and c not in enabled]
        if missing:
            _write_text(os.path.join(root, "cgroup.subtree_control"), " ".join(f"+{c}" for c in missing))
    except OSError as exc:
        return None, f"{root} does not hand the memory controller down to new cgroups ({exc})"
    problem = _unwritable(root)
    return (None, problem) if problem else ((2, root, None), "")


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mount(line: str) -> dict:
    """One /proc/self/mountinfo line: its root, mount point, filesystem type and super options."""
    fields = line.split()
    dash = fields.index("-")
    point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])  # a space is written \040
    return {"root": fields[3], "point": point, "type": fields[dash + 1], "super": fields[dash + 3].split(",")}


def _own_dir(mount: dict, path: str | None) -> str | None:
    """Our own cgroup's directory in a v1 hierarchy mounted at `mount`, if the mount shows it."""
    if path is None or not (path + "/").startswith(mount["root"].rstrip("/") + "/"):
        return None
    return os.path.normpath(os.path.join(mount["point"], path[len(mount["root"].rstrip("/")):].lstrip("/")))


def _unwritable(path: str | None) -> str:
    if path is None or not os.path.isdir(path):
        return f"our own cgroup is not visible under the cgroup mount ({path})"
    if not os.access(path, os.W_OK):
        return f"{path} is not writable for us (not root, or mounted read-only)"
    return ""


class Watchdog(CallBound):
    """Sums the PSS of the call's processes every POLL_S; past the bound, `exceeded` turns true."""

    name = "watchdog"

    def __init__(self, memory_bytes: int):
        self.memory_bytes, self.root = memory_bytes, None
        self._last_check, self._over = 0.0, False

    def started(self, pid: int) -> None:
        self.root = pid

    def exceeded(self) -> bool:
        now = time.monotonic()
        if self._over or self.root is None or now - self._last_check < POLL_S:
            return self._over
        self._last_check = now
        self._over = sum(_pss_bytes(pid) for pid in self._members()) > self.memory_bytes
        return self._over

    def close(self) -> None:
        """Stop watching. Nothing is left to kill: the sandbox's pid namespace died with its pid 1, and
        unsandboxed runs are only as contained as their process group (and the root's pid may be reused)."""
        self.root = None

    def _members(self) -> list[int]:
        """The root, its descendants and its session (a /proc scan: /proc/PID/task/TID/children is optional)."""
        children: dict[int, list[int]] = {}
        found = [self.root]
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:  # gone meanwhile
                continue
            ppid, _, session = (int(x) for x in stat[stat.rindex(b")") + 2:].split()[1:4])
            children.setdefault(ppid, []).append(int(entry))
            if session == self.root and int(entry) != self.root:
                found.append(int(entry))
        seen: set[int] = set()
        while found:
            pid = found.pop()
            if pid not in seen:
                seen.add(pid)
                found += children.get(pid, [])
        return sorted(seen)


def _pss_bytes(pid: int) -> int:
    """The proportional set size of `pid` (its RSS where smaps_rollup is missing); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # an older kernel, or not ours to read (statm is open to all); or gone, and so is statm
        pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
