"""Shards crafted to pass the integrity check (the sha256 their manifest records is theirs) but holding what no
hubgym writer writes: every reader refuses each with one ShardError naming the file, the column and the row,
before any of its values is used. The fuzzer's crash cases (fuzz_mutations.CRASH_CASES: a segmentation fault,
tracebacks and silent reads before) are one line from the installed command; a rollout stored twice is refused
naming the shard; a non-finite stored reward counts as an error and is named; a reward near the largest float
is drawn; and the fuzzer (helpers/fuzz_stored.py) runs 80 mutants of real stored files with no traceback, signal,
silent success or hang."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from helpers.fuzz_mutations import CRAFTED, CRASH_CASES, crash_case, read_table, write_table
from hubgym.cli import app
from hubgym.errors import ShardError, SkippedShardsWarning
from hubgym.hub import LocalHub
from hubgym.hub.rollouts import iter_batches, iter_rollouts, open_rollouts, push_rollouts
from hubgym.hub.rollout_stats import non_finite_rewards, scan_rollouts, summarize
from hubgym.score.rescore import rescore
from hubgym.score.stored import open_source
from hubgym.stats.table import TaskStats
from hubgym.train.groups import GroupSettings
from hubgym.train.local_shards import LocalShards
from hubgym.train.stream import GroupStream
from helpers.scored_runs import ROWS_PER_SHARD, write_run

runner = CliRunner()


def rewrite(run: Path, index: int, data: bytes) -> Path:
    """Shard `index` of `run` replaced by `data`, its sha256 and rows recorded in the manifest as a forger would."""
    shard = sorted((run / "shards").glob("*.arrow"))[index]
    shard.unlink()
    shard.write_bytes(data)
    manifest = run / "manifest-w000of001.json"
    record = json.loads(manifest.read_text())
    rows = pa.ipc.open_file(pa.BufferReader(data)).count_rows()
    record["shard_files"][shard.name].update(sha256=hashlib.sha256(data).hexdigest(), rows=rows)
    manifest.write_text(json.dumps(record))
    return shard


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("crafted") / "good")


def crafted(good: Path, folder: Path, case: str) -> Path:
    run = Path(shutil.copytree(good, folder / case.replace(" ", "-").replace(":", "").replace(",", "")))
    first = sorted((run / "shards").glob("*.arrow"))[0]
    rewrite(run, 0, crash_case(case, first.read_bytes()))
    return run


READERS = {
    "iter_rollouts": lambda run: list(iter_rollouts(run)),
    "iter_batches": lambda run: list(iter_batches(run)),
    "open_rollouts": lambda run: list(open_rollouts(run)),
    "report (scan_rollouts)": lambda run: summarize(scan_rollouts([run])),
    "score (open_source)": lambda run: list(open_source(str(run)).batches),
    "score (rescore)": lambda run: rescore(run, workers=1),
    "stats": lambda run: TaskStats.from_rollouts(run),
    "train (LocalShards)": lambda run: list(LocalShards(run)),
    "push_rollouts": lambda run: push_rollouts(run, "org/crafted", hub=LocalHub(run.parent / "hub")),
}


@pytest.mark.parametrize("case", list(CRASH_CASES))
def test_every_reader_names_the_file_column_and_row_of_a_crafted_shard(good, tmp_path, case):
    run = crafted(good, tmp_path, case)
    column = CRASH_CASES[case][0]
    for reader, read in READERS.items():
        with pytest.raises(ShardError) as refused:
            read(run)
        message = str(refused.value)
        assert "w000of001-00000.arrow" in message and re.search(rf"column '{column}', row \d+", message), \
            f"{reader}: {message}"
    with pytest.warns(SkippedShardsWarning, match="w000of001-00000.arrow"):  # --skip-bad: the other shard is read
        assert len(list(iter_rollouts(run, skip_bad=True))) == ROWS_PER_SHARD


@pytest.mark.parametrize("case", ["mask value 2", "mask one short"])
def test_a_completion_mask_that_is_not_one_0_or_1_a_token_is_refused_by_every_reader(good, tmp_path, case):
    """replay's token audit walked a mask of 2s into an IndexError (a fuzzer find): the mask is checked where the
    shard opens, for every reader."""
    run = Path(shutil.copytree(good, tmp_path / case.replace(" ", "-")))
    first = sorted((run / "shards").glob("*.arrow"))[0]
    rewrite(run, 0, write_table(CRAFTED[case](read_table(first.read_bytes()), random.Random(0))))
    for reader, read in READERS.items():
        with pytest.raises(ShardError, match=r"column 'completion_mask', row \d+") as refused:
            read(run)
        assert "w000of001-00000.arrow" in str(refused.value), reader


@pytest.mark.slow
def test_the_crash_cases_are_one_line_each_from_the_installed_command(good, tmp_path):
    """One shard per crash case in one run (read with --skip-bad, every case is opened and named), and the case
    that made `score` die of a segmentation fault read without it: exit code 1, one `error:` line, no traceback."""
    cases = list(CRASH_CASES)
    run = write_run(tmp_path / "all", groups=2 * len(cases))  # ROWS_PER_SHARD rows a shard: one shard per case
    shards = sorted((run / "shards").glob("*.arrow"))
    for i, case in enumerate(cases):
        rewrite(run, i, crash_case(case, shards[i].read_bytes()))
    segfault = crafted(good, tmp_path, "env: offsets past the end")
    commands = {"report": ["--plot", str(tmp_path / "r.png")], "score": ["--workers", "1"], "replay": []}
    for command, extra in commands.items():
        for source, more in ((run, ["--skip-bad"]), (segfault, [])):
            done = subprocess.run([sys.executable, "-m", "hubgym", command, str(source), *extra, *more],
                                  capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"}, timeout=300)
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout, done.stderr
            assert [line for line in lines if not line.startswith("note: ")][-1:] == \
                [line for line in lines if line.startswith("error: ")], done.stderr
            if more:
                assert f"skipped {len(cases)} bad shard(s) (of {len(cases)} in this read)" in done.stderr
                assert all(shard.name in done.stderr for shard in shards[:len(cases)]), done.stderr
            else:
                assert "column 'env', row" in lines[-1], lines


def test_a_rollout_stored_in_two_shards_is_refused_naming_both(good, tmp_path):
    run = Path(shutil.copytree(good, tmp_path / "run"))
    first = sorted((run / "shards").glob("*.arrow"))[0]
    copy = run / "shards" / "w000of001-00002.arrow"
    shutil.copyfile(first, copy)  # the same rows under another name, recorded as a forger would record it
    manifest = run / "manifest-w000of001.json"
    record = json.loads(manifest.read_text())
    record["shard_files"][copy.name] = dict(record["shard_files"][first.name])
    manifest.write_text(json.dumps(record))
    for reader, read in READERS.items():
        with pytest.raises(ShardError, match=rf"shard \S*{copy.name} repeats rollout '\S+', which shard "
                                             rf"\S*{first.name} holds too"):
            read(run)
    with pytest.warns(SkippedShardsWarning, match=copy.name):
        assert len(list(iter_rollouts(run, skip_bad=True))) == 2 * ROWS_PER_SHARD
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedShardsWarning)
        result = rescore(run, workers=1, skip_bad=True, out=tmp_path / "out")
    assert result.rows == 2 * ROWS_PER_SHARD and sorted(p.name for p in (tmp_path / "out" / "shards").iterdir()) == [
        "w000of001-00000.arrow", "w000of001-00001.arrow"]  # the repeating shard's output was removed


def test_a_run_given_twice_is_read_once_and_a_dataset_read_twice_is_no_repeat(good):
    assert len(list(iter_rollouts([good, good]))) == 2 * ROWS_PER_SHARD
    assert summarize(scan_rollouts([good, good / "shards"]))["rollouts"].to_list() == [2 * ROWS_PER_SHARD]
    dataset = open_rollouts(good)  # its builder keeps the ids it read: the same shards again are no repeat
    assert len(list(dataset)) == len(list(dataset)) == 2 * ROWS_PER_SHARD


def test_stored_schema_metadata_is_never_parsed_by_a_reader(good, tmp_path):
    """The file's own metadata (datasets' `huggingface` features, a field's) is not the rows: damaged, it is
    ignored by every reader, which reads the rows as the rollout schema types them (the fuzzer found polars
    tripping on a flipped byte of it)."""
    run = Path(shutil.copytree(good, tmp_path / "run"))
    for index, shard in enumerate(sorted((run / "shards").glob("*.arrow"))):
        table = read_table(shard.read_bytes()).replace_schema_metadata({b"huggingface": b'{"info": {"feat'})
        at = table.schema.get_field_index("info")
        table = table.cast(table.schema.set(at, table.schema.field(at).with_metadata({b"ARROWzextension": b""})))
        rewrite(run, index, write_table(table))
    for reader, read in READERS.items():
        if reader == "push_rollouts":  # a push publishes those features (index.json): it names them instead
            with pytest.raises(ShardError, match="declares `datasets` features that do not parse"):
                read(run)
        else:
            read(run)
    assert len(open_rollouts(run, streaming=False, cache_dir=tmp_path / "ds")) == 2 * ROWS_PER_SHARD


@pytest.mark.slow
def test_a_list_item_named_otherwise_is_refused_by_every_reader_and_report_says_so_in_one_line(good, tmp_path):
    """Arrow calls list<item: int8> and list<\\x80tem: int8> the same type, but polars panicked (the process died)
    on a name that is not UTF-8: the fuzzer's find. The names are part of the schema every shard is held to."""
    run = Path(shutil.copytree(good, tmp_path / "run"))
    first = sorted((run / "shards").glob("*.arrow"))[0]
    data = first.read_bytes()
    footer = data.rindex(b"item")  # the last list column's item name, in the file's footer schema
    rewrite(run, 0, data[:footer] + b"\x80tem" + data[footer + 4:])
    for reader, read in READERS.items():
        with pytest.raises(ShardError, match="does not have the rollout schema") as refused:
            read(run)
        assert "w000of001-00000.arrow" in str(refused.value), reader
    done = subprocess.run([sys.executable, "-m", "hubgym", "report", str(run)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "300"}, timeout=600)
    errors = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 1 and len(errors) == 1 and "Traceback" not in done.stderr + done.stdout, done.stderr


def with_rewards(good: Path, folder: Path, rewards: list[float], metric: float | None = None) -> Path:
    run = Path(shutil.copytree(good, folder))
    first = sorted((run / "shards").glob("*.arrow"))[0]
    table = read_table(first.read_bytes())
    table = table.set_column(table.schema.get_field_index("reward"), table.schema.field("reward"),
                             pa.array(rewards, pa.float64()))
    if metric is not None:
        metrics = table.column("metrics").to_pylist()
        metrics[0][0]["value"] = metric
        table = table.set_column(table.schema.get_field_index("metrics"), table.schema.field("metrics"),
                                 pa.array(metrics, table.schema.field("metrics").type))
    rewrite(run, 0, write_table(table))
    return run


def stored_rewards(run: Path) -> dict[str, float | None]:
    """rollout id -> the reward as stored (pyarrow, no hubgym reader)."""
    out = {}
    for shard in sorted((run / "shards").glob("*.arrow")):
        table = read_table(shard.read_bytes())
        out.update(zip(table.column("rollout_id").to_pylist(), table.column("reward").to_pylist()))
    return out


@pytest.mark.slow
def test_a_non_finite_stored_reward_counts_as_an_error_and_is_named(good, tmp_path):
    run = with_rewards(good, tmp_path / "run", [float("nan"), float("inf"), 0.5, 1.0])
    stored = stored_rewards(run)
    finite = [r for r in stored.values() if r == r and abs(r) != float("inf")]
    table = summarize(scan_rollouts([run]))
    assert table["errors"].to_list() == [2 / 8] and table["mean_reward"].to_list() == [pytest.approx(
        sum(finite) / len(finite))]
    [named] = non_finite_rewards(scan_rollouts([run])).to_dicts()
    assert named["env"] == "arithmetic" and named["rows"] == 2 and sorted(named["values"]) == ["NaN", "inf"]
    nan_row = next(rollout_id for rollout_id, reward in stored.items() if reward != reward)
    rows = {r["rollout_id"]: r for r in iter_rollouts(run)}
    assert rows[nan_row]["reward"] is None and rows[nan_row]["error"] == {
        "boundary": "verifier", "type": "NonFiniteReward", "message": "the stored reward nan is not a finite number"}
    stream = GroupStream([LocalShards(run)], GroupSettings(n=2, zero_variance="keep"))
    assert sum(len(group.rows) for group in stream) == 6 and stream.counts["skipped_rows/error"] == 2
    shown = runner.invoke(app, ["report", str(run), "--plot", str(tmp_path / "r.png")], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    assert "note: 2 row(s) of arithmetic store a reward that is not a finite number (" in shown.output
    assert "counted in errors" in shown.output


def test_the_report_plot_draws_rewards_and_components_near_the_largest_float(good, tmp_path):
    run = with_rewards(good, tmp_path / "run", [1e308, -1e308, 1.7976931348623157e308, 0.0], metric=1e308)
    plot = tmp_path / "huge.png"
    shown = runner.invoke(app, ["report", str(run), "--plot", str(plot)], env={"COLUMNS": "300"})
    assert shown.exit_code == 0 and "Traceback" not in shown.output, shown.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_80_mutants_of_stored_files_give_no_traceback_signal_silent_success_or_hang(tmp_path):
    """The fuzzer as CI runs it (the 10,000-mutant run in bench/RESULTS.md is the same with --mutants 10000)."""
    from helpers.fuzz_stored import BAD, TARGETS, fuzz

    outcomes = fuzz(seed=0, mutants=80, root=tmp_path / "corpus", out=tmp_path / "out")
    bad = [o for o in outcomes if o["outcome"] in BAD]
    assert not bad, "\n".join(f"{o['outcome']}: mutant {o['index']} ({o['kind']}, {o['mutation']}): {o['detail']}"
                              for o in bad[:20])
    assert len(outcomes) == 80 and {o["kind"] for o in outcomes} == set(TARGETS)
    counts = {name: sum(o["outcome"] == name for o in outcomes) for name in ("clean error", "valid success")}
    assert counts["clean error"] > 16 and counts["valid success"] > 3, counts  # refusals and reads both happen
