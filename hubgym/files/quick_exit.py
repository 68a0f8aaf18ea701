"""The `hubgym` command ends about 2 s sooner: after its exit handlers it leaves without the interpreter's teardown.

A Python process that imported torch, transformers and vLLM holds some 700,000 objects; at exit CPython tears its
modules down and collects garbage over all of them several times (2 s of a core on the machines hubgym's tests run
on), only to free memory the OS takes back anyway. `exit_now` does what matters of a normal exit, in Python's own
order -- waits for the threads that are not daemons (and lets thread pools finish their work), runs every atexit
handler (Ray's shutdown, logging's flush, temporary folders' removal, ...), flushes stdout and stderr -- and then
ends the process with its exit code. Only the command-line entry point uses it; a program that imports hubgym
keeps Python's own exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: object) -> NoReturn:
    """End the process as `sys.exit(code)` would (None -> 0, an int -> itself, anything else printed -> 1)."""
    status = _status(code)
    threading._shutdown()  # type: ignore[attr-defined]  # what Python's exit does first (threading.py)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # no stream, a closed one, a closed pipe (`hubgym ... | head`)
            pass
    os._exit(status)


def _status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
