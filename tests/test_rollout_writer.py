"""ShardWriter: atomic shards (a crash never leaves a visible half-written shard), rotation by rows and
bytes, resume ids, the manifest, and shards that pyarrow, polars and datasets all read."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from hubgym.errors import SchemaError
from hubgym.hub.rollout_stats import shard_files
from hubgym.rollout.writer import ShardWriter, worker_name
from hubgym.schemas import rollouts_to_table, validate_rollouts

from helpers.rollout_rows import WORKER, group, make_row, read_ids


def visible(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "shards").iterdir() if not p.name.startswith("."))


def test_rotation_by_rows_never_splits_a_group(tmp_path):
    writer = ShardWriter(tmp_path, WORKER, max_rows=4)

    written = [writer.add_group(group(t)) for t in range(5)]
    last = writer.flush()

    assert [len(w) for w in written] == [0, 1, 0, 1, 0]
    assert visible(tmp_path) == [f"{WORKER}-0000{i}.arrow" for i in range(3)]
    assert last == tmp_path / "shards" / f"{WORKER}-00002.arrow"
    assert [read_ids(p) for p in writer.shards()] == [
        ["run-t0-0", "run-t0-1", "run-t1-0", "run-t1-1"], ["run-t2-0", "run-t2-1", "run-t3-0", "run-t3-1"],
        ["run-t4-0", "run-t4-1"]]
    assert writer.rows_written == 10
    assert writer.flush() is None  # nothing buffered: no empty shard


def test_rows_taken_for_a_shard_are_exactly_its_rows(tmp_path):
    """The rollout loop takes a full buffer, then writes it in a thread while new groups arrive."""
    writer = ShardWriter(tmp_path, WORKER, max_rows=2)
    assert writer.add_group(group(0), flush=False) == [] and writer.full
    taken = writer.take()
    writer.add_group(group(1), flush=False)  # arrives while the taken rows are being written
    first = writer.write_shard(taken)
    second = writer.flush()

    assert [read_ids(first), read_ids(second)] == [["run-t0-0", "run-t0-1"], ["run-t1-0", "run-t1-1"]]
    assert writer.rows_written == 4 and writer.shard_files()[first.name]["rows"] == 2


def test_groups_that_finish_during_a_write_fill_the_next_shards_not_this_one(tmp_path):
    """While a write runs in a thread, several groups may finish: a take never holds more than a full shard of
    them (whole groups), the rest wait for the next shards, and a flush writes them all."""
    writer = ShardWriter(tmp_path, WORKER, max_rows=4)
    for task in range(5):  # five groups buffered before any take: more than two shards' worth
        writer.add_group(group(task), flush=False)

    first = writer.take()
    assert [r["rollout_id"] for r in first.rows] == ["run-t0-0", "run-t0-1", "run-t1-0", "run-t1-1"] and first.final
    writer.write_shard(first)
    writer.flush()

    assert [len(read_ids(p)) for p in writer.shards()] == [4, 4, 2]
    assert sorted(i for p in writer.shards() for i in read_ids(p)) == sorted(
        f"run-t{t}-{s}" for t in range(5) for s in range(2))


def test_a_shard_stores_its_groups_sorted_whatever_order_they_finished_in(tmp_path):
    """Groups finish in an order that depends on timing; a trainer streams them in stored order."""
    shards = []
    for order in ([2, 0, 1], [1, 2, 0]):
        writer = ShardWriter(tmp_path / "-".join(map(str, order)), WORKER, max_rows=100)
        for task in order:
            writer.add_group(list(reversed(group(task))))
        shards.append(read_ids(writer.flush()))

    assert shards[0] == shards[1] == [f"run-t{t}-{s}" for t in range(3) for s in range(2)]


def test_rotation_by_bytes(tmp_path):
    writer = ShardWriter(tmp_path, WORKER, max_rows=1000, max_bytes=2000)  # a 2-row group estimates ~1.1 kB

    assert writer.add_group(group(0)) == []
    assert len(writer.add_group(group(1))) == 1
    assert writer.add_group([make_row(2, 0, tokens=300)]) == [tmp_path / "shards" / f"{WORKER}-00001.arrow"]
    assert [len(read_ids(p)) for p in writer.shards()] == [4, 1]


def test_existing_ids_and_numbering_survive_a_new_writer(tmp_path):
    first = ShardWriter(tmp_path, WORKER, max_rows=2)
    first.add_group(group(0))
    first.add_group(group(1))
    first.close()  # a part of a run folder has one writer at a time (tests/test_rollout_lock.py)

    again = ShardWriter(tmp_path, WORKER, max_rows=2)
    other = ShardWriter(tmp_path, worker_name(1, 2), max_rows=2)

    assert again.existing_ids() == {"run-t0-0", "run-t0-1", "run-t1-0", "run-t1-1"}
    assert again.rows_written == 4
    assert other.existing_ids() == set()  # a worker reads only its own shards
    assert again.add_group(group(2)) == [tmp_path / "shards" / f"{WORKER}-00002.arrow"]


@pytest.mark.slow
def test_a_crash_mid_write_leaves_no_visible_shard_and_the_next_writer_cleans_up(tmp_path):
    """A real process is killed (SIGKILL) after the shard bytes hit the temp file, before the rename."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from helpers.rollout_rows import group, WORKER
        from hubgym.rollout.writer import ShardWriter
        writer = ShardWriter({str(tmp_path)!r}, WORKER, max_rows=2)
        writer.add_group(group(0))            # one complete shard
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # die where the rename would happen
        writer.add_group(group(1))
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    shard_dir = tmp_path / "shards"
    temps = list(shard_dir.glob(f".{WORKER}-00001.arrow.*.tmp"))  # hidden, uniquely named temp file
    assert len(temps) == 1
    temp = temps[0]
    other_temp = shard_dir / f".{worker_name(1, 2)}-00000.arrow.tmp"  # another worker, maybe mid-write now
    other_temp.write_bytes(b"partial")

    assert temp.is_file() and temp.stat().st_size > 0
    assert visible(tmp_path) == [f"{WORKER}-00000.arrow"]
    assert [p.name for p in shard_files([tmp_path])] == [f"{WORKER}-00000.arrow"]
    assert read_ids(shard_dir / f"{WORKER}-00000.arrow") == ["run-t0-0", "run-t0-1"]

    resumed = ShardWriter(tmp_path, WORKER, max_rows=2)

    assert not temp.exists() and other_temp.exists()
    assert resumed.existing_ids() == {"run-t0-0", "run-t0-1"}
    assert resumed.add_group(group(1)) == [shard_dir / f"{WORKER}-00001.arrow"]


def test_manifest_is_rewritten_atomically(tmp_path):
    (tmp_path / f".manifest-{WORKER}.json.tmp").write_text("{half")  # left by a crash

    writer = ShardWriter(tmp_path, WORKER)
    path = writer.write_manifest({"rows": 2, "shards": ["a.arrow"]})
    path = writer.write_manifest({"rows": 4, "shards": ["a.arrow", "b.arrow"]})

    assert path == tmp_path / f"manifest-{WORKER}.json"
    assert json.loads(path.read_text()) == {"rows": 4, "shards": ["a.arrow", "b.arrow"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".lock-{WORKER}", f"manifest-{WORKER}.json", "shards"]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    writer = ShardWriter(run_dir, WORKER, max_rows=4)
    for t in range(5):
        writer.add_group(group(t))
    writer.flush()
    return run_dir


EXPECTED_IDS = sorted(f"run-t{t}-{i}" for t in range(5) for i in range(2))


def test_shards_read_with_pyarrow_and_pass_validation(written):
    tables = [pa.ipc.open_file(str(p)).read_all() for p in shard_files([written])]

    for table in tables:
        validate_rollouts(table)
    table = pa.concat_tables(tables)
    assert sorted(table.column("rollout_id").to_pylist()) == EXPECTED_IDS
    row = table.slice(0, 1).to_pylist()[0]
    assert row["completion_mask"] == [1, 1, 0, 0, 0, 1] and row["completion_logprobs"][2:5] == [0.0, 0.0, 0.0]
    assert json.loads(row["info"]) == {"answer": "0", "nested": {"k": [1, 2]}}  # info is stored as JSON


def test_shards_scan_with_polars(written):
    frame = (pl.scan_ipc(sorted((written / "shards").glob("*.arrow")))
             .select("rollout_id", "group", pl.col("completion_mask").list.sum().alias("model_tokens"))
             .collect())

    assert sorted(frame["rollout_id"].to_list()) == EXPECTED_IDS
    assert frame["model_tokens"].to_list() == [3] * 10
    assert frame.group_by("group").len()["len"].to_list() == [2] * 5


@pytest.mark.parametrize("streaming", [False, True])
def test_shards_load_with_datasets(written, streaming, tmp_path):
    import datasets

    files = [str(p) for p in shard_files([written])]
    loaded = datasets.load_dataset("arrow", data_files=files, split="train", streaming=streaming,
                                   cache_dir=str(tmp_path / "cache"))
    rows = list(loaded)

    assert sorted(r["rollout_id"] for r in rows) == EXPECTED_IDS
    assert all(len(r["completion_ids"]) == len(r["completion_mask"]) == len(r["completion_logprobs"]) for r in rows)
    assert rows[0]["completion"][1]["role"] == "tool" and rows[0]["completion"][1]["content"] == "0"


def test_validation_catches_a_misaligned_token_record():
    bad = make_row(0, 0)
    bad["completion_mask"] = bad["completion_mask"][:-1]

    with pytest.raises(SchemaError, match=r"row='run-t0-0' field='completion_mask'"):
        validate_rollouts(rollouts_to_table([make_row(1, 0), bad]))
