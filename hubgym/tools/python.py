"""The `python` tool: run a model-written program in the bubblewrap sandbox and return its output.

What counts as a failed call (the tool raises, so the Toolbox answers "Error: ..." and records a
RowError): the sandbox is unavailable, the program ran past its time, used more memory than the
call may (all of its processes together), flooded its output, or was killed by a signal (CPU
limit, crash). A program that merely exits non-zero (an exception, a failed assertion,
sys.exit(1)) is a successful call: its traceback is the answer the model needs, so it is
returned as text followed by "[exit status N]".
"""

# No `from __future__ import annotations`: the @tool decorator reads the hints as objects.

import signal

from hubgym.tools.base import MAX_OUTPUT_CHARS, tool
from hubgym.tools.sandbox import SandboxConfig, SandboxResult, run_sandboxed

PYTHON_SANDBOX = SandboxConfig(timeout_s=10.0, cpu_s=10, memory_mb=1024, max_procs=64, max_output_bytes=64_000)
"""The limits of every `python` call (read at call time)."""

OUTPUT_CHARS = MAX_OUTPUT_CHARS - 200  # leave room for the status line, so the Toolbox's own cut never hides it
ERROR_TAIL_CHARS = 600  # how much of a stopped program's output its error message quotes
SIGNAL_REASONS = {signal.SIGXCPU: "it used up its CPU time", signal.SIGSEGV: "it crashed (segmentation fault)",
                  signal.SIGKILL: "it passed a resource limit"}


@tool(timeout_s=PYTHON_SANDBOX.timeout_s + 10)  # the sandbox stops itself first; this is a backstop
def python(code: str) -> str:
    """Run a Python 3 program and return what it prints (stdout, then stderr).

    Every call is a fresh, isolated process: no network, no files or variables from earlier calls.
    The standard library and installed packages can be imported. Values of bare expressions are
    not shown, so print what you need. Limits: 10 seconds and 1 GB of memory per call (all of
    its processes together).

    Args:
        code: the complete program, e.g. "import math\\nprint(math.comb(10, 3))".
    """
    config = PYTHON_SANDBOX
    result = run_sandboxed(code, config)
    if result.memory_exceeded:
        raise MemoryError(f"the program used more than the {config.memory_mb} MB memory limit (all of its processes "
                          f"together) and was stopped{_last_output(result)}")
    if result.timed_out:
        raise TimeoutError(f"the program ran past the {config.timeout_s:g}s time limit and was stopped"
                           f"{_last_output(result)}")
    if result.truncated:
        raise RuntimeError(f"the program printed more than {config.max_output_bytes} bytes and was stopped; "
                           f"print less (a summary, or a slice){_last_output(result)}")
    if result.exit_code < 0:
        reason = SIGNAL_REASONS.get(-result.exit_code, "it was stopped")
        raise RuntimeError(f"the program was killed by {result.signal_name}: {reason}{_last_output(result)}")
    text = _clip(_combined(result))
    if result.exit_code != 0:
        separator = "" if not text or text.endswith("\n") else "\n"
        text += f"{separator}[exit status {result.exit_code}]"
    return text or "(no output)"


def _combined(result: SandboxResult) -> str:
    if result.stdout and result.stderr and not result.stdout.endswith("\n"):
        return result.stdout + "\n" + result.stderr
    return result.stdout + result.stderr


def _clip(text: str) -> str:
    """Keep the head and the tail (where a traceback ends) of long output."""
    if len(text) <= OUTPUT_CHARS:
        return text
    half = OUTPUT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _last_output(result: SandboxResult) -> str:
    text = _combined(result)
    return f"; its last output was:\n{text[-ERROR_TAIL_CHARS:]}" if text.strip() else ""
