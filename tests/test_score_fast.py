"""The fast paths of re-scoring give what the plain paths give, on hostile rows.

- `score_batch` (columns built in bulk from the scores) vs `score_rows` (row by row, metrics built as the
  rollout writer builds them): carried and re-scored errors, an `info` missing the field a reward reads,
  rewards that are NaN or not numbers, graded rewards, components that differ from row to row, two envs
  and a multi_turn env in one batch, a batch of carried rows only, an empty batch.
- the diff's Arrow pairing (components line up) vs its polars join (`long_form`), and the fallback to the
  join when they do not (components added or dropped, duplicated names, null metrics).
- `rescore_shard` (one shard in, one shard out, for a caller mapping shards over workers): missing verifiers,
  a corrupted shard, what it writes, and `merge_parts` over shards equal to `rescore` of the folder.
- `rescore_shards` (a bundle of shards scored together): the same bytes per output shard as one shard at a
  time, with carried rows, two envs and a corrupted shard in the bundle.
- `fetch_shard`: the bytes hashed are the bytes opened, even when the file is replaced in between.
No model runs: rows are built from each env's golden cases.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import textwrap
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from hubgym.envs import resolve_env
from hubgym.rollout.writer import ShardWriter
from hubgym.schemas.rollouts import ROLLOUT_SCHEMA
from hubgym.score import rescore
from hubgym.score.choice import VerifierChoice, VerifierSpec
from hubgym.score.diff import COLUMNS, Tally, _flags, flat_and_long, long_form
from hubgym.score.rescore import POOLS
from hubgym.score.scoring import SCORED_COLUMNS, score_batch, score_rows
from hubgym.score.shards import merge_parts, rescore_shard, rescore_shards

ENGINE_ERROR = {"boundary": "engine", "type": "RequestError", "message": "prompt too long"}
VERIFIER_ERROR = {"boundary": "verifier", "type": "KeyError", "message": "'answer'"}
HOSTILE_VERIFIER = '''
import math

def graded(task, completion):  # a fraction of the reply's length; NaN or text for two marked replies
    reply = completion[-1]["content"] or ""
    if "nan" in reply:
        return math.nan
    if "text" in reply:
        return "0.5"
    return min(len(reply), 40) / 40

def strict(task, completion):  # reads a field some rows leave out of info
    return float(task["info"]["answer"] in (completion[-1]["content"] or ""))

REWARDS = {graded: 1.0, strict: 0.5}
'''


def golden(env: str) -> list[tuple[dict, list[dict]]]:
    """(task, completion) of each golden case of `env` (multi_turn cases played from their actions)."""
    builder = resolve_env(env)
    verifier = builder.verifier()
    return [(dict(c.task), c.completion if c.completion is not None
             else verifier.run_episode(dict(c.task), c.actions).completion()) for c in builder.golden_cases()]


def stored_row(i: int, task: dict, completion: list[dict], *, error: dict | None = None,
               finish_reason: str = "stop", info: dict | None = None) -> dict:
    verifier = resolve_env(task["env"]).verifier()
    score = verifier.score(task, completion)
    metrics = [{"name": f"reward/{k}", "value": v} for k, v in score.components.items()]
    return {
        "rollout_id": f"r-{task['id']}-{i}", "run_id": "r", "task_id": task["id"], "env": task["env"],
        "group": f"r-{task['id']}", "sample": i, "prompt": task["prompt"], "completion": completion,
        "info": task["info"] if info is None else info, "interaction": task["interaction"], "prompt_ids": [1, 2],
        "completion_ids": [3], "completion_mask": [1], "completion_logprobs": [-1.0], "tokens_consistent": True,
        "reward": None if error else score.reward, "metrics": metrics + [{"name": "success", "value": 0.0}],
        "finish_reason": finish_reason, "truncated": False, "num_turns": 1, "error": error or score.error,
        "provenance": {"model": "golden", "policy_version": 0, "sampling": "{}", "env_repo": None,
                       "env_revision": None, "verifier_module": verifier.name, "verifier_sha256": verifier.sha256,
                       "engine": "none", "engine_version": "0", "chat_template_sha256": None},
        "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0},
        "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    }


def hostile_rows() -> list[dict]:
    """Rows of arithmetic (some hostile), reverse_text and wordle (multi_turn, one reply cut short)."""
    (task, completion), *_ = golden("arithmetic")

    def reply(text: str) -> list[dict]:
        return [{"role": "assistant", "content": text}]
    rows = [stored_row(0, task, completion), stored_row(1, task, reply("nan please")),
            stored_row(2, task, reply("a text reply")), stored_row(3, task, completion, error=ENGINE_ERROR),
            stored_row(4, task, completion, error=VERIFIER_ERROR),
            stored_row(5, task, completion, info={k: v for k, v in task["info"].items() if k != "answer"}),
            stored_row(6, task, reply("<answer>99</answer>"))]
    rows += [stored_row(10 + i, t, c) for i, (t, c) in enumerate(golden("reverse_text"))]
    rows += [stored_row(20 + i, t, c, finish_reason="length" if i == 0 else "stop")
             for i, (t, c) in enumerate(golden("wordle"))]
    return rows


def slim_batch(rows: list[dict]) -> pa.RecordBatch:
    """Rows as `slim` lays them out: the scored columns, `info` as its JSON text."""
    schema = pa.schema([pa.field(c, pa.string()) if c == "info" else ROLLOUT_SCHEMA.field(c) for c in SCORED_COLUMNS])
    return pa.RecordBatch.from_pylist([{**{c: r[c] for c in SCORED_COLUMNS}, "info": json.dumps(r["info"])}
                                       for r in rows], schema=schema)


@pytest.fixture(scope="module")
def hostile_spec(tmp_path_factory) -> VerifierSpec:
    path = tmp_path_factory.mktemp("verifier") / "hostile_verifier.py"
    path.write_text(textwrap.dedent(HOSTILE_VERIFIER))
    return VerifierChoice({"arithmetic": str(path)}).spec("arithmetic")


def specs_for(rows: list[dict], arithmetic: VerifierSpec) -> dict[str, VerifierSpec]:
    choice = VerifierChoice()
    return {env: arithmetic if env == "arithmetic" else choice.spec(env)
            for env in dict.fromkeys(r["env"] for r in rows)}


@pytest.mark.parametrize("pick", ["all", "arithmetic", "carried only", "none", "same components"])
def test_score_batch_equals_the_row_by_row_path_on_hostile_rows(pick, hostile_spec):
    rows = hostile_rows()
    rows = {"all": rows, "arithmetic": [r for r in rows if r["env"] == "arithmetic"],
            "carried only": [r for r in rows if r["error"] == ENGINE_ERROR], "none": [],
            "same components": [r for r in rows if r["env"] == "reverse_text"]}[pick]
    specs = specs_for(rows, hostile_spec)
    batch = slim_batch(rows) if rows else slim_batch(hostile_rows()).slice(0, 0)

    fast, plain = score_batch(specs, batch), score_rows(specs, batch)

    assert fast.schema.equals(plain.schema) and fast.to_pylist() == plain.to_pylist()
    assert fast.equals(plain)
    if pick == "all":  # the hostile rows did what they are there for
        new = fast.to_pylist()
        assert new[3]["rescore_error"] == ENGINE_ERROR and new[3]["rescore_metrics"] == []
        assert new[4]["rescore_error"] is None  # a verifier error is scored again
        assert {new[i]["rescore_error"]["type"] for i in (1, 2, 5)} == {"TypeError", "KeyError"}
        assert 0 < new[6]["rescore_reward"] < 1.5 and new[6]["rescore_reward"] != round(new[6]["rescore_reward"])
        assert {m["name"] for m in new[5]["rescore_metrics"]} == {"reward/graded", "success"}  # strict raised


def test_score_batch_scores_a_table_of_several_batches_as_its_batches(hostile_spec):
    rows = hostile_rows()
    specs = specs_for(rows, hostile_spec)
    batch = slim_batch(rows)
    table = pa.Table.from_batches([batch.slice(0, 5), batch.slice(5, 4), batch.slice(9)])
    assert score_batch(specs, table).equals(score_batch(specs, batch))


def diff_table(rows: list[dict], specs: dict[str, VerifierSpec]) -> pa.Table:
    """The diff's columns of `rows` re-scored with `specs`."""
    stored = pa.Table.from_pylist([{c: r[c] for c in COLUMNS[:5]} for r in rows],
                                  schema=pa.schema([ROLLOUT_SCHEMA.field(c) for c in COLUMNS[:5]]))
    new = score_rows(specs, slim_batch(rows))
    return pa.Table.from_arrays([*(stored.column(c) for c in COLUMNS[:5]), *new.columns[:3]], names=COLUMNS)


def long_by_join(table: pa.Table) -> pl.DataFrame:
    return long_form(_flags(pl.from_arrow(table)))


def sorted_long(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort("rollout_id", "component", "old", "new", nulls_last=True)


@pytest.mark.parametrize("case", ["same verifier", "changed verifier", "duplicated and null metrics"])
def test_the_diff_pairs_components_as_the_join_does(case, hostile_spec, monkeypatch):
    rows = hostile_rows()
    if case == "same verifier":
        del rows[5]  # its info was edited: a component vanishes
    specs = specs_for(rows, hostile_spec) if case == "changed verifier" else specs_for(rows, None)
    if case == "same verifier":
        specs["arithmetic"] = VerifierChoice().spec("arithmetic")
    if case == "duplicated and null metrics":
        specs["arithmetic"] = VerifierChoice().spec("arithmetic")
        rows[0]["metrics"] = rows[0]["metrics"] + rows[0]["metrics"][:1]
        rows[10]["metrics"] = None
    table = diff_table(rows, specs)
    joined = long_by_join(table)
    if case == "same verifier":  # components line up: paired in Arrow, no join
        monkeypatch.setattr("hubgym.score.diff.long_form", lambda frame: pytest.fail("joined"))

    frame, long = flat_and_long(table)

    assert sorted_long(long).equals(sorted_long(joined))
    assert frame["carried"].to_list() == [r["error"] == ENGINE_ERROR for r in rows]
    changed = long.filter(pl.col("changed"))
    assert changed.height == joined["changed"].sum() > 0
    if case == "same verifier":  # only the total of the row whose verifier had failed (now scored)
        assert changed.select("component", "old").rows() == [("*", None)]


def test_a_tally_folded_in_pieces_equals_one_fold(hostile_spec):
    rows = hostile_rows()
    table = diff_table(rows, specs_for(rows, hostile_spec))
    whole, pieces = Tally(), Tally(fold_rows=4)
    whole.add(table)
    for batch in table.to_batches(max_chunksize=3):
        pieces.add(batch)
    one, many = whole.result(), pieces.result()
    assert one.summary.equals(many.summary) and one.changes.equals(many.changes)
    assert one.counts.equals(many.counts) and one.pairs.equals(many.pairs)
    assert one.changes.height > 0


@pytest.fixture()
def run(tmp_path) -> Path:
    """A run folder of 2 shards (arithmetic and reverse_text rows), with a manifest recording their sha256."""
    for k, env in enumerate(("arithmetic", "reverse_text")):  # one shard each, as two rollout workers write
        rows = [stored_row(i, t, c) for i, (t, c) in enumerate(golden(env))]
        writer = ShardWriter(tmp_path / "run", f"w00{k}of002")
        writer.add_group(rows)
        writer.flush()
        writer.write_manifest({"schema_version": "1.0", "run_id": "r", "worker": writer.worker, "rows": len(rows),
                               "shards": [p.name for p in writer.shards()], "shard_files": writer.shard_files(),
                               "envs": {}, "updated_at": "2026-01-01T00:00:00+00:00"})
    return tmp_path / "run"


def test_rescore_shard_asks_for_missing_verifiers_then_scores_and_writes_one_shard(run, tmp_path):
    from hubgym.hub.rollout_reader import shard_sources

    shards = shard_sources(str(run))
    choice = VerifierChoice()
    specs: dict[str, VerifierSpec] = {}
    parts = []
    for index, shard in enumerate(shards):
        out = tmp_path / "out" / f"part-{index}.arrow"
        part = rescore_shard(shard, specs, out)
        assert part.missing and not part.done and not out.exists()  # each shard is of an env not resolved yet
        specs.update({env: choice.spec(env) for env in part.missing})
        part = rescore_shard(shard, specs, out)
        assert part.done and part.output["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
        assert pa.ipc.open_file(out).read_all().num_rows == part.rows == part.output["rows"]
        parts.append(part)

    whole = rescore(run, workers=1)
    merged = merge_parts(parts)
    assert merged.summary.equals(whole.diff) and merged.counts.equals(whole.counts)
    assert whole.changed == 0 and sum(p.rows for p in parts) == whole.rows


def test_rescore_shard_reports_a_corrupted_shard_without_writing(run, tmp_path):
    from hubgym.hub.rollout_reader import shard_sources

    shard = shard_sources(str(run))[0]
    data = bytearray(Path(shard.location).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(shard.location).write_bytes(bytes(data))

    part = rescore_shard(shard, {}, tmp_path / "x.arrow")

    assert part.error and "sha256" in part.error and not part.done and not (tmp_path / "x.arrow").exists()


def visible_files(folder: Path) -> dict[str, bytes]:
    """What a reader of `folder` sees: every file not hidden, by its path inside the folder."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


KILL_AFTER_FIRST_SHARD = """
import os, signal, sys
from hubgym.score import rescore
rescore(sys.argv[1], out=sys.argv[2], workers=1, progress=lambda done, total: os.kill(os.getpid(), signal.SIGKILL))
"""


@pytest.mark.slow
def test_a_re_score_that_fails_is_stopped_or_is_killed_leaves_out_as_it_found_it(run, tmp_path):
    """All or nothing: shards scored before a bad shard, a Ctrl-C or a SIGKILL never read as OUT's run, and
    the previous re-score in OUT stays whole; a second re-score cannot write to OUT while one runs."""
    import subprocess
    import sys

    from hubgym.errors import NoShardsError, RunFolderError, ShardError
    from hubgym.hub.rollouts import iter_rollouts
    from hubgym.score.output import RescoreOutput

    out, fresh = tmp_path / "out", tmp_path / "fresh"
    previous = rescore(run, out=out, workers=1)
    kept = visible_files(out)
    bad = sorted((run / "shards").glob("*.arrow"))[-1]
    good_bytes = bad.read_bytes()
    flipped = bytearray(good_bytes)
    flipped[len(flipped) // 2] ^= 0xFF

    def interrupt(done, total):
        raise KeyboardInterrupt

    bad.write_bytes(bytes(flipped))
    for folder in (out, fresh):
        with pytest.raises(ShardError, match=bad.name):
            rescore(run, out=folder, workers=1)
    bad.write_bytes(good_bytes)
    with pytest.raises(KeyboardInterrupt):
        rescore(run, out=out, workers=1, progress=interrupt)
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_SHARD, str(run), str(out)])
    assert killed.returncode == -9
    assert visible_files(out) == kept and len(list(iter_rollouts(out))) == previous.rows
    assert not [p for p in (fresh / "shards").iterdir() if p.name.startswith(".partial-")]
    with pytest.raises(NoShardsError):
        list(iter_rollouts(fresh))
    assert [p.name for p in (out / "shards").iterdir() if p.name.startswith(".partial-")], "the kill left its staging"

    held = RescoreOutput(out, [run])
    with pytest.raises(RunFolderError, match="being written"):
        rescore(run, out=out, workers=1)
    held.close()
    again = rescore(run, out=out, workers=1)  # removes what the killed one staged
    assert visible_files(out).keys() == kept.keys() and not list((out / "shards").glob(".partial-*"))
    assert again.rows == previous.rows and len(list(iter_rollouts(out))) == previous.rows


def test_a_bundle_of_shards_writes_the_bytes_each_shard_alone_writes(tmp_path):
    from hubgym.hub.rollout_reader import shard_sources

    writer = ShardWriter(tmp_path / "run", "w000of001", max_rows=4)
    cases = golden("arithmetic") + golden("reverse_text")
    for i, (task, completion) in enumerate(cases * 2):  # small shards of both envs, some rows carried
        writer.add_group([stored_row(i, task, completion, error=ENGINE_ERROR if i % 5 == 0 else None)])
    writer.flush()
    writer.write_manifest({"schema_version": "1.0", "run_id": "r", "worker": writer.worker, "rows": writer.rows_written,
                           "shards": [p.name for p in writer.shards()], "shard_files": writer.shard_files(),
                           "envs": {}, "updated_at": "2026-01-01T00:00:00+00:00"})
    shards = shard_sources(str(tmp_path / "run"))
    bad = Path(shards[1].location)
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    specs = {env: VerifierChoice().spec(env) for env in ("arithmetic", "reverse_text")}
    assert len(shards) >= 4

    together = rescore_shards(shards, specs, [tmp_path / "bundle" / f"{i}.arrow" for i in range(len(shards))])
    alone = [rescore_shard(shard, specs, tmp_path / "alone" / f"{i}.arrow") for i, shard in enumerate(shards)]

    assert "sha256" in together[1].error and not (tmp_path / "bundle" / "1.arrow").exists()
    for i, (a, b) in enumerate(zip(together, alone)):
        assert (a.rows, a.error, a.run_ids, a.output) == (b.rows, b.error, b.run_ids, b.output)
        if i != 1:
            assert (tmp_path / "bundle" / f"{i}.arrow").read_bytes() == (tmp_path / "alone" / f"{i}.arrow").read_bytes()
            assert a.diff_rows.equals(b.diff_rows)
    assert merge_parts(together).counts.equals(merge_parts(alone).counts)
    assert merge_parts(together).counts["carried"].sum() > 0


def test_a_bundle_holding_an_env_without_a_verifier_scores_nothing(run, tmp_path):
    from hubgym.hub.rollout_reader import shard_sources

    shards = shard_sources(str(run))  # one arithmetic shard, one reverse_text shard
    specs = {"arithmetic": VerifierChoice().spec("arithmetic")}
    parts = rescore_shards(shards, specs, [tmp_path / "a", tmp_path / "b"])
    assert all(p.missing == ["reverse_text"] and not p.done for p in parts)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_bytes_a_shard_is_checked_by_are_the_bytes_read(run):
    """A shard replaced after it was read and hashed (an atomic rename by a re-run, say) is not read anew: the
    rows handed out are the ones that matched the sha256."""
    from hubgym.hub.rollout_reader import shard_sources
    from hubgym.hub.shards import fetch_shard, open_fetched

    first, second = shard_sources(str(run))
    fetched = fetch_shard(first)
    expected = pa.ipc.open_file(first.location).read_all()
    replacement = Path(first.location).with_suffix(".tmp")
    replacement.write_bytes(Path(second.location).read_bytes())
    os.replace(replacement, first.location)

    loaded = open_fetched(fetched)

    assert fetched.sha256 == first.sha256
    assert pa.Table.from_batches(list(loaded.batches())).equals(expected)


@pytest.mark.slow
def test_two_processes_read_shards_themselves_and_give_what_one_gives(run, tmp_path):
    one = rescore(run, out=tmp_path / "one", workers=1)
    two = rescore(run, out=tmp_path / "two", workers=2)
    assert one.diff.equals(two.diff) and one.counts.equals(two.counts) and one.rows == two.rows > 0
    assert [p.name for p in one.shards] == [p.name for p in two.shards]
    for a, b in zip(one.shards, two.shards):
        assert a.read_bytes() == b.read_bytes()
    pool = POOLS[(os.getpid(), 2)]  # kept: the next re-score in this process does not start one again
    assert rescore(run, workers=2).rows == one.rows and POOLS[(os.getpid(), 2)] is pool
