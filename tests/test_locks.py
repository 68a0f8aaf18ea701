"""No lock outlives its holder, and no wait is silent: hubgym's flocks (a run folder's claim, the model
conversions), datasets' cache locks and torch's build baton of DeepSpeed's CPU op, each held by a real process
that is then SIGKILLed. The waiter names what it waits for and the holder's pid, then goes on."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from hubgym.files import locks
from hubgym.files.locks import BatonWatch, exclusive, flock_holders, library_lock_notes, openers
from hubgym.train.ops import EXTENSIONS_DIR


def holder(code: str) -> subprocess.Popen:
    """A process that runs `code` (which takes a lock), prints "held" and sleeps until it is killed."""
    script = textwrap.dedent(code) + "\nprint('held', flush=True)\nimport time\ntime.sleep(600)\n"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def kill_later(child: subprocess.Popen, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: child.send_signal(signal.SIGKILL))
    timer.start()
    return timer


@pytest.fixture
def quick_notes(monkeypatch, caplog):
    monkeypatch.setattr(locks, "WAIT_NOTE_S", 0.3)
    caplog.set_level(logging.WARNING, logger="hubgym.files.locks")
    return caplog


@pytest.mark.slow
def test_a_flock_of_a_killed_process_is_taken_and_the_wait_names_the_holder(tmp_path, quick_notes):
    path = tmp_path / "convert.lock"
    child = holder(f"from hubgym.files.locks import exclusive\nheld = exclusive({str(path)!r}, 'x')\nheld.__enter__()")
    assert flock_holders(path) == [child.pid]
    timer = kill_later(child, 1.5)
    started = time.monotonic()
    with exclusive(path, "the conversion of a model"):
        waited = time.monotonic() - started
    timer.join()
    child.wait()
    assert 1.0 < waited < 30
    expected = f"waiting for the conversion of a model: {path} is locked by pid {child.pid} (python"
    assert re.search(re.escape(expected) + r"[\d.]* -c ", quick_notes.text), quick_notes.text  # python, python3.11


@pytest.mark.slow
def test_a_run_claim_lock_of_a_killed_process_does_not_stall_the_next_claim(tmp_path, quick_notes):
    from hubgym.rollout.runlock import claim_run

    run = tmp_path / "run"
    run.mkdir()
    child = holder(f"from pathlib import Path\nfrom hubgym.rollout.runlock import _locked\n"
                   f"held = _locked(Path({str(run / '.lock')!r}))\nheld.__enter__()")
    timer = kill_later(child, 1.0)
    claim_run(run, "r1")
    timer.join()
    child.wait()
    assert (run / ".run-id").read_text() == "r1\n" and f"the run claim of {run}" in quick_notes.text


@pytest.mark.slow
def test_a_build_baton_left_by_a_killed_process_is_removed_and_a_live_one_is_named(tmp_path, quick_notes):
    baton = tmp_path / "op" / "lock"
    baton.parent.mkdir()
    child = holder(f"import os\nfd = os.open({str(baton)!r}, os.O_CREAT | os.O_EXCL)")  # as torch's FileBaton
    assert openers(baton) == [child.pid]
    with BatonWatch(baton, "an op being built") as watch:
        time.sleep(2.5)  # held by a live process: named (the watch reads /proc every second then), kept
        assert baton.exists() and not watch.taken_over
        child.send_signal(signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 10
        while baton.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not baton.exists() and watch.taken_over
    assert f"waiting for an op being built: {baton} is held by pid {child.pid}" in quick_notes.text
    assert f"removed {baton}, left by a process that was killed while holding it" in quick_notes.text
    baton.touch()  # left before this process started: removed on entry, before anything waits on it
    with BatonWatch(baton, "an op being built"):
        assert not baton.exists()


def test_a_baton_this_process_holds_is_its_own_build_not_a_wait(tmp_path, quick_notes):
    """`make setup` builds the op in the process that watches: it says so, not that it waits for itself."""
    baton = tmp_path / "op" / "lock"
    baton.parent.mkdir()
    fd = os.open(baton, os.O_CREAT | os.O_EXCL)  # as torch's FileBaton, held by this process
    try:
        with BatonWatch(baton, "an op being built") as watch:
            time.sleep(2.5)
            assert baton.exists() and not watch.taken_over
    finally:
        os.close(fd)
    assert "building an op being built" in quick_notes.text and "waiting for" not in quick_notes.text


@pytest.mark.slow
def test_a_datasets_cache_lock_waited_on_names_its_holder_and_dies_with_it(tmp_path, quick_notes):
    from datasets.utils._filelock import FileLock

    path = tmp_path / "builder.lock"
    child = holder(f"from datasets.utils._filelock import FileLock\nheld = FileLock({str(path)!r})\nheld.acquire()")
    library_lock_notes()
    timer = kill_later(child, 1.5)
    with FileLock(str(path)):
        pass
    timer.join()
    child.wait()
    assert f"waiting for {path} (a cache lock of datasets or another library): locked by pid {child.pid}" in \
        quick_notes.text


def link_only(build: Path) -> None:
    """The compiled objects (and ninja's records of them) of the op the suite already built, where there is one: the
    next build then only links, instead of compiling for another 80 s what `make setup` compiled."""
    built = Path(os.environ.get("TORCH_EXTENSIONS_DIR", EXTENSIONS_DIR.expanduser())) / build.name
    for name in (".ninja_log", ".ninja_deps", "shm.o", "shm_interface.o"):
        if (built / name).is_file() and (built / "deepspeed_shm_comm.so").is_file():
            shutil.copy2(built / name, build / name)  # with their times, which ninja compares with its records


@pytest.mark.slow
def test_deepspeeds_op_build_killed_midway_is_taken_over_by_the_next_run(tmp_path):
    """`python -m hubgym.train.ops` is what `hubgym train` runs first (engine.init_distributed): SIGKILLed while
    the op compiles, it leaves torch's baton behind; the next one removes it, builds the op and loads it."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    baton = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    first = subprocess.Popen([sys.executable, "-m", "hubgym.train.ops"], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not baton.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    time.sleep(3)  # mid-build: the compiler runs
    assert baton.exists() and first.poll() is None, "the first build never started"
    os.killpg(first.pid, signal.SIGKILL)  # the run and its compiler processes, as a killed terminal job
    first.wait()
    assert baton.exists()  # what used to stall every later run forever
    link_only(baton.parent)
    second = subprocess.run([sys.executable, "-m", "hubgym.train.ops"], env=env, capture_output=True, text=True,
                            timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"removed {baton}, left by a process that was killed while holding it" in second.stderr
    assert (baton.parent / "deepspeed_shm_comm.so").is_file() and not baton.exists()
