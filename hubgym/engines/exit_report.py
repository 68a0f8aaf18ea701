"""No "nanobind: leaked N instances" block at the end of a Python program that started a vLLM engine.

vLLM imports triton (on a CPU only to find that it has no CPU backend), and triton's bindings are nanobind's, whose
check at interpreter shutdown lists every object of the binding still alive: at the end of a program that ran
vLLM, some 600 are, because the interpreter does not free every module's objects when it ends. Nothing leaks (the
OS takes the memory back), yet a library user sees a page of it after their own output. The `hubgym` command never
reaches that check: it leaves right after its exit handlers (hubgym.files.quick_exit). A program that imports hubgym
keeps Python's own exit, so the engine calls `quiet_exit_report()`: when Python runs the exit handlers, the
standard error stream goes on through a small filter process that passes every line but that report's, so what
else is written to stderr after it (a traceback in a later exit handler, say) still shows.

    quiet_exit_report()     # once per process; does nothing unless triton's bindings are loaded at exit
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys

REPORT_LINES = (b"nanobind: ", b" - leaked ", b" - ... skipped remainder", b"See https://nanobind.readthedocs.io")
BINDINGS = ("triton._C.libtriton", "triton._C.libproton")
FILTER = f"""
import os
skip = {REPORT_LINES!r}
rest = b""
while True:
    data = os.read(0, 65536)
    if not data:
        break
    *lines, rest = (rest + data).split(b"\\n")
    kept = b"".join(line + b"\\n" for line in lines if not line.startswith(skip))
    if kept:
        os.write(1, kept)
if rest and not rest.startswith(skip):
    os.write(1, rest)
"""

_registered = False


def quiet_exit_report() -> None:
    """Filter the binding's shutdown report out of stderr at exit (registered once per process)."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(_filter_stderr)


def _filter_stderr() -> None:
    """At exit: fd 2 becomes a pipe into the filter, which writes to the stderr this process had."""
    if not any(name in sys.modules for name in BINDINGS):
        return
    try:
        sys.stderr.flush()
        read, write = os.pipe()
        subprocess.Popen([sys.executable, "-S", "-I", "-c", FILTER], stdin=read, stdout=os.dup(2),
                         stderr=subprocess.DEVNULL, close_fds=True)
        os.close(read)
        os.dup2(write, 2)  # the pipe closes when this process ends: the filter then writes what is left and ends
        os.close(write)
    except OSError:  # no stderr, no process to spare: the report shows, nothing else changes
        pass
