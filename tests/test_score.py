"""Re-scoring stored rollouts: shards made by real vLLM runs, re-scored with the same and with changed verifiers.

One module-scoped run (arithmetic and reverse_text, 4 tasks x 2 samples each, tiny model, real vLLM)
makes the shards every test reads. The changed verifier is a copy of the arithmetic verifier whose
`formatted` component means "the reply is longer than the median reply" and weighs 0.5, so the
rows and components it changes are known from the stored text alone.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.errors import NoShardsError, RescoreError, ShardError, VerifierNotTrustedError
from hubgym.hub import LocalHub
from hubgym.envs import push_env
from hubgym.hub.rollouts import push_rollouts
from hubgym.engines import SamplingArgs, VLLMEngine
from hubgym.rollout import RolloutConfig, run_rollouts
from hubgym.rollout.writer import ShardWriter
from hubgym.score import rescore
from hubgym.verifiers import arithmetic as arithmetic_verifier
from hubgym.verifiers.rewards import final_text

pytestmark = pytest.mark.slow  # its stored runs are sampled with vLLM

ENVS = ["arithmetic:easy", "reverse_text"]
ORIGINAL_REWARDS = "BATCH_REWARDS = {correct: 1.0, formatted: 0.0}"


@pytest.fixture(scope="module")
def stored(tiny_model, tmp_path_factory) -> Path:
    """A run folder of real rollouts: 2 envs x 4 tasks x 2 samples = 16 rows."""
    out = tmp_path_factory.mktemp("stored") / "run"
    engine = VLLMEngine(str(tiny_model), max_model_len=1024, enforce_eager=True)
    try:
        config = RolloutConfig(envs=ENVS, model=str(tiny_model), out=str(out), n=2, limit=4,
                               sampling=SamplingArgs(max_tokens=16), max_model_len=1024, max_rows_per_shard=4)
        assert run_rollouts(config, engine=engine, progress=False).written == 16
    finally:
        engine.close()
    return out


def read_rows(folder: Path) -> list[dict]:
    rows = []
    for path in sorted((folder / "shards").glob("*.arrow")):
        rows += pa.ipc.open_file(path).read_all().to_pylist()
    return rows


def stored_table(folder: Path) -> pa.Table:
    return pa.concat_tables(pa.ipc.open_file(p).read_all() for p in sorted((folder / "shards").glob("*.arrow")))


def reward_metrics(metrics: list[dict]) -> dict[str, float]:
    return {m["name"]: m["value"] for m in metrics if m["name"].startswith("reward/") or m["name"] == "success"}


@pytest.fixture(scope="module")
def threshold(stored) -> int:
    """The median length of the arithmetic replies: about half are longer."""
    lengths = [len(final_text(r["completion"])) for r in read_rows(stored) if r["env"] == "arithmetic"]
    return int(statistics.median(lengths))


def changed_verifier(folder: Path, threshold: int, *, raise_on_task: str | None = None) -> Path:
    """A modified copy of the arithmetic verifier module."""
    source = Path(arithmetic_verifier.__file__).read_text()
    assert ORIGINAL_REWARDS in source
    changed = (f"def formatted(tasks, completions):  # redefined: 1.0 for a reply longer than the median\n"
               f"    if any(task['id'] == {raise_on_task!r} for task in tasks):\n"
               f"        raise ValueError('cannot score this one')\n"
               f"    return [float(len(final_text(completion)) > {threshold}) for completion in completions]\n\n\n"
               f"BATCH_REWARDS = {{correct: 1.0, formatted: 0.5}}")
    path = folder / ("arith_raises.py" if raise_on_task else "arith_v2.py")
    path.write_text(source.replace(ORIGINAL_REWARDS, changed))
    return path


def expected_changes(rows: list[dict], threshold: int) -> set[tuple[str, str]]:
    """(rollout_id, component) pairs the changed verifier must change, worked out from the stored rows."""
    expected = set()
    for row in rows:
        if row["env"] != "arithmetic":
            continue
        new_formatted = float(len(final_text(row["completion"])) > threshold)
        if new_formatted != reward_metrics(row["metrics"])["reward/formatted"]:
            expected.add((row["rollout_id"], "formatted"))
        if new_formatted:  # weight 0.5: the total moves
            expected.add((row["rollout_id"], "*"))
    return expected


def test_the_same_verifier_changes_nothing(stored, tmp_path):
    seen = []
    result = rescore(stored, out=tmp_path / "same", workers=1, progress=lambda rows, total: seen.append((rows, total)))

    assert (result.rows, result.changed, len(result.changes)) == (16, 0, 0)
    assert sum(rows for rows, _ in seen) == 16 and {total for _, total in seen} == {16}
    assert result.counts.select("env", "rows", "rescored", "carried", "rescore_errors").rows() == [
        ("arithmetic", 8, 8, 0, 0), ("reverse_text", 8, 8, 0, 0)]
    assert set(result.diff["component"]) == {"*", "answer_found", "correct", "formatted", "reversal", "exact"}
    original = {r["rollout_id"]: r for r in read_rows(stored)}
    written = read_rows(tmp_path / "same")
    assert sorted(r["rollout_id"] for r in written) == sorted(original)
    for row in written:
        before = original[row["rollout_id"]]
        assert {k: v for k, v in row.items() if not k.startswith("rescore_")} == before  # every column kept
        assert row["rescore_reward"] == before["reward"] and row["rescore_error"] is None
        assert reward_metrics(row["rescore_metrics"]) == reward_metrics(before["metrics"])
        assert (row["rescore_verifier_module"], row["rescore_verifier_sha256"]) == (
            before["provenance"]["verifier_module"], before["provenance"]["verifier_sha256"])


def test_the_output_is_a_run_folder_with_a_manifest_and_can_be_re_scored_again(stored, tmp_path):
    first = rescore(stored, out=tmp_path / "a", workers=1)
    manifest = json.loads(first.manifest.read_text())

    assert manifest["kind"] == "rescore" and manifest["rows"] == 16 and manifest["rescore"]["changed"] == 0
    assert manifest["rescore"]["verifiers"]["arithmetic"]["module"] == "hubgym.verifiers.arithmetic"
    for path in first.shards:
        recorded = manifest["shard_files"][path.name]
        assert recorded["rows"] == pa.ipc.open_file(path).read_all().num_rows
        assert recorded["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    again = rescore(tmp_path / "a", out=tmp_path / "b", workers=1)  # rescore_* columns are replaced, not doubled
    schema = pa.ipc.open_file(again.shards[0]).schema
    assert again.changed == 0 and schema.names == pa.ipc.open_file(first.shards[0]).schema.names
    rerun = rescore(stored, out=tmp_path / "a", workers=1)  # replaces the previous re-score in place
    assert sorted(p.name for p in (tmp_path / "a" / "shards").iterdir()) == sorted(p.name for p in rerun.shards)
    hub = LocalHub(tmp_path / "hub")  # a run folder like any other: it pushes, and re-scores from the hub
    pushed = push_rollouts(tmp_path / "a", "org/rescored", hub=hub)
    from_hub = rescore(pushed.ref, hub=hub, workers=1)
    assert pushed.name == manifest["run_id"] and (from_hub.rows, from_hub.changed) == (16, 0)


def test_a_changed_verifier_names_exactly_the_rows_and_components_that_changed(stored, threshold, tmp_path):
    rows = read_rows(stored)
    expected = expected_changes(rows, threshold)
    result = rescore(stored, verifier=f"arithmetic={changed_verifier(tmp_path, threshold)}", workers=1)

    assert 0 < len(expected) and {rid for rid, _ in expected} < {r["rollout_id"] for r in rows}
    assert set(zip(result.changes["rollout_id"], result.changes["component"])) == expected
    assert set(result.changes["env"]) == {"arithmetic"}  # reverse_text keeps its current verifier
    per_component = {(r["env"], r["component"]): r for r in result.diff.iter_rows(named=True)}
    assert per_component[("arithmetic", "*")]["changed"] == result.changed == sum(c == "*" for _, c in expected)
    assert per_component[("arithmetic", "formatted")]["changed"] == sum(c == "formatted" for _, c in expected)
    assert per_component[("arithmetic", "correct")]["changed"] == 0
    total = per_component[("arithmetic", "*")]
    assert total["mean_new"] == pytest.approx(total["mean_old"] + 0.5 * total["changed"] / 8)
    assert total["max_abs_delta"] == pytest.approx(0.5)
    assert {env: s.origin for env, s in result.verifiers.items()} == {"arithmetic": "module",
                                                                      "reverse_text": "registry"}
    assert result.unused == []
    elsewhere = rescore(stored, verifier={"wordle": str(tmp_path / "arith_v2.py")}, workers=1)
    assert elsewhere.changed == 0 and elsewhere.unused == [f"--verifier wordle={tmp_path / 'arith_v2.py'}"]


def test_a_verifier_without_env_is_refused_for_two_envs_and_applies_to_one(stored, threshold, tmp_path):
    v2 = changed_verifier(tmp_path, threshold)
    with pytest.raises(RescoreError, match=r"names no env, and the rollouts hold rows of .* say which env it "
                                           r"scores: --verifier (arithmetic|reverse_text)="):
        rescore(stored, verifier=str(v2), workers=1)
    table = stored_table(stored)
    only = table.filter(pc.equal(table["env"], "arithmetic"))
    result = rescore(only.to_batches(max_chunksize=3), verifier=str(v2), workers=1)  # any Iterable[RecordBatch]
    assert result.rows == 8 and set(zip(result.changes["rollout_id"], result.changes["component"])) == \
        expected_changes(read_rows(stored), threshold)


def test_two_workers_give_what_one_worker_gives(stored, threshold, tmp_path):
    v2 = changed_verifier(tmp_path, threshold)
    table = stored_table(stored).combine_chunks()
    results = {}
    for workers in (1, 2):  # 6 batches of 3 rows: the pool spreads them over both processes
        results[workers] = rescore(table.to_batches(max_chunksize=3), verifier={"arithmetic": str(v2)},
                                   out=tmp_path / f"w{workers}", workers=workers)
    one, two = results[1], results[2]
    assert one.changed > 0 and len(one.shards) == len(two.shards) == 6
    assert one.diff.equals(two.diff) and one.changes.equals(two.changes) and one.counts.equals(two.counts)
    for a, b in zip(one.shards, two.shards):
        assert pa.ipc.open_file(a).read_all().equals(pa.ipc.open_file(b).read_all())


def test_error_rows_are_carried_or_re_scored_and_counted(stored, threshold, tmp_path):
    rows = read_rows(stored)
    for row in rows:
        row["info"] = json.loads(row["info"]) if isinstance(row["info"], str) else row["info"]
    tasks = sorted({r["task_id"] for r in rows if r["env"] == "arithmetic"})
    failed = next(r for r in rows if r["task_id"] == tasks[0])
    verifier_failed = next(r for r in rows if r["task_id"] == tasks[1])
    raising_task = tasks[2]
    failed.update(reward=None, error={"boundary": "engine", "type": "RequestError", "message": "prompt too long"})
    verifier_failed.update(reward=None, error={"boundary": "verifier", "type": "KeyError", "message": "'answer'"})
    writer = ShardWriter(tmp_path / "with-errors", "w000of001")
    writer.add_group(rows)
    writer.flush()
    raises = changed_verifier(tmp_path, threshold, raise_on_task=raising_task)

    result = rescore(tmp_path / "with-errors", verifier={"arithmetic": str(raises)}, out=tmp_path / "out", workers=1)

    written = {r["rollout_id"]: r for r in read_rows(tmp_path / "out")}
    carried = written[failed["rollout_id"]]
    assert carried["rescore_reward"] is None and carried["rescore_error"] == failed["error"]
    assert carried["rescore_verifier_module"] is None and carried["rescore_metrics"] == []
    assert failed["rollout_id"] not in set(result.changes["rollout_id"])  # null before, null after: unchanged
    again = written[verifier_failed["rollout_id"]]  # its verifier failed before: scored again, a reward appears
    assert again["rescore_reward"] is not None and again["rescore_error"] is None
    assert (verifier_failed["rollout_id"], "*") in set(zip(result.changes["rollout_id"], result.changes["component"]))
    raised = [r for r in written.values() if r["task_id"] == raising_task]
    assert len(raised) == 2 and all(r["rescore_reward"] is None for r in raised)
    assert all(r["rescore_error"]["boundary"] == "verifier" and r["rescore_error"]["type"] == "ValueError"
               for r in raised)
    counts = result.counts.filter(result.counts["env"] == "arithmetic").row(0, named=True)
    assert (counts["rows"], counts["carried"], counts["rescored"]) == (8, 1, 7)
    assert (counts["stored_errors"], counts["null_rewards"], counts["rescore_errors"]) == (2, 2, 2)


def test_a_hub_env_revision_needs_a_pin_or_trust(stored, tmp_path):
    hub = LocalHub(tmp_path / "hub")
    pushed = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"],
                      overrides={"sizes": {"train": 4, "test": 4}})
    with pytest.raises(VerifierNotTrustedError, match="runs only when its sha256 matches a pin"):
        rescore(stored, env_revision=pushed.ref, hub=hub, workers=1)
    sha = pushed.manifest["code"]["sha256"]
    result = rescore(stored, env_revision=pushed.ref, pin=f"sha256:{sha}", hub=hub, workers=1)
    assert result.changed == 0  # the pushed verifier is the current one
    assert result.verifiers["arithmetic"].origin == f"org/arith@{pushed.revision}"
    assert result.verifiers["arithmetic"].sha256 == pushed.manifest["verifier"]["sha256"]
    assert result.verifiers["reverse_text"].origin == "registry"


def test_an_output_folder_that_overlaps_a_source_is_refused(stored, tmp_path):
    for out in (stored, stored / "rescored", stored.parent):
        with pytest.raises(RescoreError, match="overlaps the source"):
            rescore(stored, out=out, workers=1)
    assert len(read_rows(stored)) == 16  # nothing of the source was touched


def test_bad_sources_are_named(stored, tmp_path):
    broken = tmp_path / "broken" / "shards"
    broken.mkdir(parents=True)
    (broken / "w000of001-00000.arrow").write_bytes((stored / "shards" / "w000of001-00000.arrow").read_bytes()[:300])
    with pytest.raises(ShardError, match=r"w000of001-00000\.arrow is truncated or corrupted"):
        rescore(tmp_path / "broken", workers=1)
    with pytest.raises(NoShardsError, match=r"runs/missing does not exist"):
        rescore("./runs/missing", workers=1)
    with pytest.raises(ShardError, match=r"lacks the rollout column\(s\) completion"):
        rescore(stored_table(stored).drop_columns(["completion"]), workers=1)


def test_cli_prints_the_tables_and_writes_the_png(stored, threshold, tmp_path):
    v2 = changed_verifier(tmp_path, threshold)
    runner = CliRunner()
    result = runner.invoke(app, ["score", str(stored), "--verifier", f"arithmetic={v2}", "--out",
                                 str(tmp_path / "out"), "--plot", str(tmp_path / "diff.png"), "--workers", "1"],
                           env={"COLUMNS": "200"})

    assert result.exit_code == 0, result.output
    changed = len({rid for rid, c in expected_changes(read_rows(stored), threshold) if c == "*"})
    assert f"what changed: {changed} of 16 rows" in result.output
    for text in ("arithmetic", "reverse_text", "(total)", "formatted", "verifiers used", "registry", "module"):
        assert text in result.output
    assert (tmp_path / "diff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "out" / "manifest-w000of001.json").read_text())["rescore"]["changed"] == changed

    refused = runner.invoke(app, ["score", str(stored), "--verifier", str(v2)], env={"COLUMNS": "200"})
    assert refused.exit_code == 1 and "names no env" in " ".join(refused.output.split())
