"""Finished groups reach disk by time, not only when a shard fills: the open shard is written with the rows it has
so far and written again as more arrive, and a run that is not killed ends with the shards of size flushing."""

from __future__ import annotations

import pytest

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hubgym.files import sha256_file
from hubgym.rollout.writer import ShardWriter

from helpers.rollout_rows import WORKER, group, read_ids


def wait_until_due(writer: ShardWriter) -> None:
    deadline = time.monotonic() + 60
    while not writer.due and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.due


def test_a_finished_group_is_written_once_it_waited_flush_every_s_and_the_open_shard_grows(tmp_path):
    writer = ShardWriter(tmp_path, WORKER, max_rows=6, flush_every_s=0.05)
    shard = tmp_path / "shards" / f"{WORKER}-00000.arrow"

    assert writer.add_group(group(1)) == [] and not writer.full  # 2 of 6 rows: not written by size
    wait_until_due(writer)
    assert writer.flush_due() == shard and read_ids(shard) == ["run-t1-0", "run-t1-1"]
    assert writer.shard_files() == {shard.name: {"rows": 2, "sha256": sha256_file(shard)}}

    writer.add_group(group(0))
    wait_until_due(writer)
    assert writer.flush_due() == shard  # the same shard again, with both groups in stored order
    assert read_ids(shard) == ["run-t0-0", "run-t0-1", "run-t1-0", "run-t1-1"] and writer.rows_written == 4

    assert writer.add_group(group(2)) == [shard] and len(read_ids(shard)) == 6  # full: written at once, closed
    writer.add_group(group(3))
    assert writer.flush() == tmp_path / "shards" / f"{WORKER}-00001.arrow"
    assert writer.rows_written == 8 and not writer.due and writer.flush_due() is None


def test_flushing_by_time_ends_with_the_same_shards_as_flushing_by_size(tmp_path):
    by_size = ShardWriter(tmp_path / "size", WORKER, max_rows=4, flush_every_s=3600)
    by_time = ShardWriter(tmp_path / "time", WORKER, max_rows=4, flush_every_s=0.0)
    for task in [3, 0, 4, 1, 2]:
        by_size.add_group(group(task))
        by_time.add_group(group(task), flush=False)
        by_time.flush_due()
    by_size.flush()
    by_time.flush()

    assert [p.name for p in by_time.shards()] == [p.name for p in by_size.shards()]
    assert [sha256_file(p) for p in by_time.shards()] == [sha256_file(p) for p in by_size.shards()]


@pytest.mark.slow
def test_a_resumed_writer_reads_the_open_shard_again_when_the_manifest_lags(tmp_path):
    """Killed after the open shard was written again but before the manifest was: the manifest's sha256 is old."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from helpers.rollout_rows import group, WORKER
        from hubgym.rollout.writer import ShardWriter
        writer = ShardWriter({str(tmp_path)!r}, WORKER, max_rows=100, flush_every_s=0.0)
        writer.add_group(group(0), flush=False)
        writer.flush_due()
        writer.write_manifest({{"shard_files": writer.shard_files()}})
        writer.add_group(group(1), flush=False)
        writer.flush_due()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    shard = tmp_path / "shards" / f"{WORKER}-00000.arrow"

    resumed = ShardWriter(tmp_path, WORKER, max_rows=100)

    assert resumed.shard_files() == {shard.name: {"rows": 4, "sha256": sha256_file(shard)}}
    assert resumed.existing_ids() == {"run-t0-0", "run-t0-1", "run-t1-0", "run-t1-1"}
    resumed.add_group(group(2))
    assert resumed.flush() == tmp_path / "shards" / f"{WORKER}-00001.arrow"  # never over the killed run's rows
