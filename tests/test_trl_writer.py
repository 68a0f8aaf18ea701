"""The TRL recorder's writer process (hubgym.integrations.trl_writer): everything handed to it is on disk when it
closes, whoever ends first; it runs below the trainer's priority; a second writer on the same folder, a writer that
dies and a row no reader would take are each one clear error, and nothing stored before is lost."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubgym.errors import RunFolderError
from hubgym.integrations.trl_writer import NICE, WriterProcess, WriterSetup
from hubgym.rollout.writer import ShardWriter
from helpers.rollout_rows import WORKER, group, read_ids

pytestmark = pytest.mark.slow  # each test starts a writer process (a few seconds of imports)

TRAINER_KILLED = """
import os, signal, sys
from pathlib import Path
from hubgym.integrations.trl_writer import WriterProcess, WriterSetup
from helpers.rollout_rows import WORKER, group

writer = WriterProcess(WriterSetup(Path(sys.argv[1]), WORKER, "run", None, None, {"run_id": "run"}))
print(writer.process.pid, flush=True)
for task in range(6):
    writer.put(group(task), task)
writer.wait_handed()
os.kill(os.getpid(), signal.SIGKILL)
"""


def setup(out: Path) -> WriterSetup:
    return WriterSetup(out, WORKER, "run", None, None, {"run_id": "run", "recorded_from": "trl"})


def stored_ids(out: Path) -> list[str]:
    return sorted(i for shard in sorted((out / "shards").glob("*.arrow")) for i in read_ids(shard))


def expected_ids(tasks: range) -> list[str]:
    return sorted(r["rollout_id"] for t in tasks for r in group(t))


def test_every_batch_handed_over_is_on_disk_with_its_manifest_when_the_writer_closes(tmp_path):
    writer = WriterProcess(setup(tmp_path))
    for task in range(5):
        writer.put(group(task), task)
    stats = writer.close()
    assert stats["error"] is None and stats["rows"] == 10 and stats["batches"] == 5
    assert stored_ids(tmp_path) == expected_ids(range(5))
    manifest = json.loads((tmp_path / f"manifest-{WORKER}.json").read_text())
    assert manifest["rows"] == 10 and manifest["policy_version"] == 4 and manifest["recorded_from"] == "trl"
    assert sum(f["rows"] for f in manifest["shard_files"].values()) == 10


def test_the_writer_runs_below_the_trainers_cpu_priority(tmp_path):
    writer = WriterProcess(setup(tmp_path))
    try:
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, writer.process.pid) == min(19, own + NICE)
    finally:
        writer.close()


def test_rows_already_stored_are_not_written_again_by_a_rerun(tmp_path):
    first = WriterProcess(setup(tmp_path))
    first.put(group(0), 0)
    assert first.close()["rows"] == 2
    again = WriterProcess(setup(tmp_path))
    again.put(group(0) + group(1), 1)
    assert again.close()["rows"] == 4
    assert stored_ids(tmp_path) == expected_ids(range(2))


def test_a_trainer_killed_with_sigkill_leaves_every_row_it_handed_over_written(tmp_path):
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", TRAINER_KILLED, str(tmp_path)], capture_output=True, text=True,
                          cwd=root, env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests'}"},
                          timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 120
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the writer process did not end when its trainer died"
    assert stored_ids(tmp_path) == expected_ids(range(6))
    manifest = json.loads((tmp_path / f"manifest-{WORKER}.json").read_text())
    assert manifest["rows"] == 12 and manifest["policy_version"] == 5
    ShardWriter(tmp_path, WORKER, run_id="run").close()  # the folder's lock was given back


def test_a_process_forked_from_the_trainer_does_not_keep_the_writer_from_finishing(tmp_path):
    writer = WriterProcess(setup(tmp_path))
    writer.put(group(0), 0)
    forked = os.fork()  # as a DataLoader worker is: it holds a copy of every descriptor the trainer had
    if forked == 0:
        time.sleep(60)
        os._exit(0)
    try:
        stats = writer.close()  # returns once the writer has finished, while the fork still lives
        assert stats["rows"] == 2 and os.waitpid(forked, os.WNOHANG) == (0, 0)
    finally:
        os.kill(forked, signal.SIGKILL)
        os.waitpid(forked, 0)


def test_a_batch_cut_off_mid_send_is_dropped_and_every_whole_one_before_it_written(tmp_path):
    writer = WriterProcess(setup(tmp_path))
    for task in range(3):
        writer.put(group(task), task)
    writer.wait_handed()
    torn = pickle.dumps((group(3), 3), protocol=pickle.HIGHEST_PROTOCOL)
    writer.process.stdin.write(torn[:len(torn) // 2])  # what a trainer killed while sending leaves in the pipe
    writer.process.stdin.flush()
    stats = writer.close()
    assert stats["error"] is None and stats["rows"] == 6
    assert stored_ids(tmp_path) == expected_ids(range(3))


def test_a_second_writer_on_the_same_folder_is_refused_when_it_starts(tmp_path):
    first = WriterProcess(setup(tmp_path))
    try:
        with pytest.raises(RunFolderError, match=rf"is being written by process {first.process.pid}"):
            WriterProcess(setup(tmp_path))
    finally:
        first.close()


def test_a_writer_that_dies_is_one_error_at_close_naming_how_it_ended(tmp_path):
    writer = WriterProcess(setup(tmp_path))
    writer.process.kill()
    writer.process.wait()
    writer.put(group(0), 0)
    stats = writer.close()
    assert stats["rows"] is None and stats["error"].startswith(f"the writer process ended with code {-signal.SIGKILL}")


def test_a_row_no_reader_would_take_is_an_error_naming_it_and_the_rows_before_stay(tmp_path):
    writer = WriterProcess(setup(tmp_path))
    writer.put(group(0), 0)
    writer.close()
    broken = group(1)
    broken[1]["completion_mask"] = broken[1]["completion_mask"][:-1]
    writer = WriterProcess(setup(tmp_path))
    writer.put(broken, 1)
    stats = writer.close()
    assert "run-t1-1" in stats["error"] and "completion_mask" in stats["error"]
    assert stored_ids(tmp_path) == expected_ids(range(1))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
