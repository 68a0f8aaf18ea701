"""The purity guard: while a verifier scores, network use, file writes and new processes are refused.

Python's audit hooks (PEP 578) see every `open`, `socket.connect`, `os.remove`, `subprocess.Popen`
and so on. A hook can be added but never removed, so one hook is installed on first use and does
nothing unless a guard is active in the *current context* (a ContextVar): other threads and
asyncio tasks keep working normally while one of them checks a verifier.

    with purity_guard() as violations:
        score = verifier.score(task, completion)
    if violations:
        print(violations[0])   # "file write: open '/tmp/x' mode 'w'"

A forbidden event raises ImpureVerifierError inside the offending call *and* is recorded, so a
verifier that swallows the exception is still caught. Reading files stays allowed (a verifier
may load the data it ships). Bytecode writing is switched off while a guard is active, so a lazy
`import` inside a verifier is not mistaken for a file write. Threads that the verifier itself
starts run outside the guard (ContextVars do not follow new threads); the checker does not try
to police those.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

from hubgym.errors import ImpureVerifierError

NETWORK_EVENTS = frozenset({
    "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
    "socket.gethostbyaddr", "socket.getnameinfo", "socket.sendto", "socket.sendmsg", "urllib.Request",
    "http.client.connect",
})
FILESYSTEM_EVENTS = frozenset({
    "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.lchmod", "os.chown", "os.lchown", "os.link",
    "os.symlink", "os.truncate", "os.utime", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr", "os.chflags",
    "os.lchflags",
})
PROCESS_EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
    "os.killpg", "os.startfile",
})
ENVIRONMENT_EVENTS = frozenset({"os.putenv", "os.unsetenv"})  # process-wide state other code reads
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
"""`open` events carry the os-level flags; any of these means the file may be created or changed."""


@dataclass(frozen=True)
class Violation:
    """One forbidden event seen while a guard was active."""

    kind: str  # "network", "file write", "process" or "environment"
    event: str  # the audit event name, e.g. "socket.connect"
    detail: str  # the event's arguments, shortened

    def __str__(self) -> str:
        return f"{self.kind}: {self.event} {self.detail}"


_ACTIVE: ContextVar[list[Violation] | None] = ContextVar("hubgym_purity_guard", default=None)
_install_lock = threading.Lock()
_installed = False
_bytecode_lock = threading.Lock()
_bytecode_depth = 0  # guards active in any thread; bytecode writing is restored when it drops to 0
_bytecode_saved = False


def classify(event: str, args: tuple[Any, ...]) -> str | None:
    """The kind of side effect an audit event is, or None when it is allowed while scoring."""
    if event == "open":
        mode, flags = (args[1], args[2]) if len(args) >= 3 else (None, 0)
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & WRITE_FLAGS)
        return "file write" if writes else None
    if event in NETWORK_EVENTS:
        return "network"
    if event in FILESYSTEM_EVENTS or event.startswith("shutil."):
        return "file write"
    if event in PROCESS_EVENTS:
        return "process"
    if event in ENVIRONMENT_EVENTS:
        return "environment"
    return None


def _describe(event: str, args: tuple[Any, ...]) -> str:
    if event == "open":
        return f"{args[0]!r} mode {args[1]!r}" if args[1] is not None else f"{args[0]!r} flags {args[2]:#o}"
    if args and type(args[0]).__name__ == "socket":
        args = args[1:]  # socket.connect/bind/sendto: the socket object itself says nothing useful
    elif event == "socket.getaddrinfo":
        args = args[:2]  # host and port; family, type, proto and flags are noise here
    return " ".join(repr(a) for a in args)[:200]


def _hook(event: str, args: tuple[Any, ...]) -> None:
    violations = _ACTIVE.get()
    if violations is None:
        return
    kind = classify(event, args)
    if kind is None:
        return
    violation = Violation(kind, event, _describe(event, args))
    violations.append(violation)
    raise ImpureVerifierError(f"{violation} is not allowed while scoring: a verifier must be pure "
                              f"(no network, no file writes, no processes)")


def install() -> None:
    """Add the audit hook (once per process); it stays dormant until a guard is active."""
    global _installed
    with _install_lock:
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True


@contextmanager
def purity_guard() -> Iterator[list[Violation]]:
    """Refuse network, file writes and processes in this context; yields the list of what was refused.

    Guards nest: an inner guard records into its own list.
    """
    install()
    _bytecode_off()
    token = _ACTIVE.set([])
    try:
        yield _ACTIVE.get()  # type: ignore[misc]
    finally:
        _ACTIVE.reset(token)
        _bytecode_restore()


def guard_active() -> bool:
    return _ACTIVE.get() is not None


def _bytecode_off() -> None:
    """A lazy import inside a verifier would write a .pyc (a file write); imports stay allowed, .pyc writes stop."""
    global _bytecode_depth, _bytecode_saved
    with _bytecode_lock:
        if _bytecode_depth == 0:
            _bytecode_saved = sys.dont_write_bytecode
            sys.dont_write_bytecode = True
        _bytecode_depth += 1


def _bytecode_restore() -> None:
    global _bytecode_depth
    with _bytecode_lock:
        _bytecode_depth -= 1
        if _bytecode_depth == 0:
            sys.dont_write_bytecode = _bytecode_saved
