"""hubgym.files.quick_exit: the `hubgym` command leaves without Python's teardown, and loses nothing a normal exit
would have done: every atexit handler runs, threads that are not daemons finish, a thread pool's queued work is
done, buffered output reaches the pipe, and the exit code is the one sys.exit would give."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from hubgym.files.quick_exit import exit_now

out = sys.argv[1]
def note(what):
    with open(out, "a") as handle:
        handle.write(what + "\n")

atexit.register(note, "atexit handler")
threading.Thread(target=lambda: (time.sleep(0.3), note("thread"))).start()
pool = ThreadPoolExecutor(1)
pool.submit(lambda: (time.sleep(0.3), note("first job")))
pool.submit(note, "queued job")
sys.stdout.write("no newline, still buffered")
exit_now(eval(sys.argv[2]))
'''


@pytest.mark.parametrize("code, status", [("None", 0), ("0", 0), ("3", 3), ("-1", 255), ("'a message'", 1)])
def test_exit_now_does_what_a_normal_exit_does_before_leaving(tmp_path, code, status):
    notes = tmp_path / "notes"
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout is a buffered pipe
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(notes), code], capture_output=True, text=True,
                          timeout=60, env=buffered)
    assert done.returncode == status, done.stderr
    assert done.stdout == "no newline, still buffered"
    assert sorted(notes.read_text().splitlines()) == ["atexit handler", "first job", "queued job", "thread"]
    assert done.stderr == ("a message\n" if status == 1 else "")


@pytest.mark.slow
def test_the_command_keeps_its_exit_codes(tmp_path):
    """`hubgym` through its entry point (python -m hubgym): success, a usage error (typer's 2), a hubgym error."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hubgym", *args], capture_output=True, text=True, timeout=120)

    assert run("--help").returncode == 0 and "Usage" in run("--help").stdout
    assert run("no-such-command").returncode == 2
    failed = run("report", str(tmp_path / "missing"))
    assert failed.returncode == 1 and "missing" in failed.stdout + failed.stderr
