"""Task statistics across runs (`hubgym stats`, hubgym.stats): exact counts from real shards, idempotent and
order-independent merges, a round trip through a local hub and the loopback Hub-API server, one clear error per
bad input with nothing written, and a DifficultyBand that keeps exactly its band and moves with new rows."""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from pathlib import Path

import datasets
import polars as pl
import pytest
from typer.testing import CliRunner

import hubgym.cli.stats  # noqa: F401  (registers `stats` on the app)
from hubgym.envs.build import build_tasks
from hubgym.cli import app
from hubgym.errors import EnvContractError, ManifestError
from hubgym.envs import open_env
from hubgym.rollout.writer import ShardWriter
from hubgym.schemas import assistant
from hubgym.stats import DifficultyBand, TaskStats, check_tasks, load_stats, read_stats, write_stats

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")

TASKS = build_tasks("arithmetic", "easy")["test"]
T = [TASKS[i]["id"] for i in range(4)]
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)



def with_tasks(spec: str):
    """The env, opened, with every task of its test split read."""
    env = open_env(spec)
    env.take("test")
    return env

def row(run_id: str, task: int, sample: int, reward: float | None, *, version: int = 0, success: bool = True,
        minute: int = 0, env: str = "arithmetic") -> dict:
    """One rollout row of arithmetic:easy task `task` (rewards set directly: no model, no verifier run)."""
    t = TASKS[task]
    metrics = [{"name": "reward/correct", "value": reward or 0.0}]
    if success and reward is not None:  # what `hubgym rollout` records; without it the verifier's threshold decides
        metrics.append({"name": "success", "value": float(reward >= 1.0)})
    return {
        "rollout_id": f"{run_id}-{t['id']}-{sample}", "run_id": run_id, "task_id": t["id"], "env": env,
        "group": f"{run_id}-{t['id']}", "sample": sample, "prompt": t["prompt"],
        "completion": [assistant("<answer>1</answer>")], "info": t["info"], "interaction": t["interaction"],
        "prompt_ids": [1, 2], "completion_ids": [3], "completion_mask": [1], "completion_logprobs": [-0.5],
        "tokens_consistent": True, "reward": reward, "metrics": metrics, "finish_reason": "stop", "truncated": False,
        "num_turns": 1, "error": None if reward is not None else {"boundary": "engine", "type": "E", "message": "x"},
        "provenance": {"model": "m", "policy_version": version, "sampling": "{}", "env_repo": None,
                       "env_revision": None, "verifier_module": "hubgym.verifiers.arithmetic", "verifier_sha256": "0",
                       "engine": "vllm", "engine_version": "0", "chat_template_sha256": None},
        "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0},
        "created_at": START + dt.timedelta(minutes=minute)}


def write_run(folder: Path, run_id: str, groups: list[list[dict]]) -> Path:
    """A run folder as `hubgym rollout` writes it: shards of 3 rows at most, and the worker's manifest."""
    writer = ShardWriter(folder, "w000of001", max_rows=3)
    for group in groups:
        writer.add_group(group)
    writer.flush()
    writer.write_manifest({"run_id": run_id, "model": "m", "policy_version": 0, "sampling": {},
                           "envs": {"arithmetic": {"config": "easy", "tasks": len(groups)}},
                           "shard_files": writer.shard_files()})
    return folder


def run_a(tmp_path: Path) -> Path:
    """Policy version 0, n=4, success recorded: task 0 never right, task 1 twice, task 2 always."""
    right = {0: 0, 1: 2, 2: 4}
    return write_run(tmp_path / "a", "ra", [[row("ra", t, s, float(s < k), minute=t) for s in range(4)]
                                            for t, k in right.items()])


def run_b(tmp_path: Path) -> Path:
    """Policy version 3, n=2, no success metric (the arithmetic verifier's threshold, 1.0, decides): task 1 right
    once, 0.5 once (not a pass); task 3 right once and one failed rollout (no reward)."""
    groups = [[row("rb", 1, 0, 1.0, version=3, success=False, minute=10),
               row("rb", 1, 1, 0.5, version=3, success=False, minute=11)],
              [row("rb", 3, 0, 1.0, version=3, success=False, minute=12),
               row("rb", 3, 1, None, version=3, success=False, minute=13)]]
    return write_run(tmp_path / "b", "rb", groups)


EXPECTED = {  # task: (samples, errors, reward_sum, passes, last_policy_version, runs)
    T[0]: (4, 0, 0.0, 0, 0, ["ra"]),
    T[1]: (6, 0, 3.5, 3, 3, ["ra", "rb"]),
    T[2]: (4, 0, 4.0, 4, 0, ["ra"]),
    T[3]: (1, 1, 1.0, 1, 3, ["rb"]),
}


def as_expected(stats: TaskStats) -> dict:
    tasks = stats.tasks()
    assert tasks["env"].unique().to_list() == ["arithmetic"]
    return {r["task_id"]: (r["samples"], r["errors"], r["reward_sum"], r["passes"], r["last_policy_version"], r["runs"])
            for r in tasks.iter_rows(named=True)}


def test_stats_of_two_run_folders_are_exact(tmp_path):
    stats = TaskStats.from_rollouts([run_a(tmp_path), run_b(tmp_path)])
    assert as_expected(stats) == EXPECTED
    tasks = stats.tasks().sort("task_id")
    by_id = {r["task_id"]: r for r in tasks.iter_rows(named=True)}
    assert by_id[T[1]]["pass_rate"] == 0.5 and by_id[T[1]]["reward_mean"] == pytest.approx(3.5 / 6)
    assert by_id[T[3]]["pass_rate"] == 1.0 and by_id[T[0]]["pass_rate"] == 0.0
    assert by_id[T[1]]["first_seen"] == START + dt.timedelta(minutes=1)
    assert by_id[T[1]]["last_seen"] == START + dt.timedelta(minutes=11)
    summary = stats.summary().row(0, named=True)
    assert summary == {"env": "arithmetic", "tasks": 4, "samples": 15, "mean_pass_rate": pytest.approx(2.5 / 4),
                       "signal": 0.25}  # only task 1 lies strictly between 0 and 1


def test_merge_is_idempotent_and_order_independent(tmp_path):
    a, b = TaskStats.from_rollouts(run_a(tmp_path)), TaskStats.from_rollouts(run_b(tmp_path))
    both = TaskStats.from_rollouts([tmp_path / "a", tmp_path / "b"])
    for merged in (a.merge(b), b.merge(a), a.merge(b, a, b), a.merge(a).merge(b).merge(b), b.merge(a.merge(b))):
        assert merged.parts.equals(both.parts)
    assert TaskStats.from_rollouts([tmp_path / "a", tmp_path / "a"]).parts.equals(a.parts)  # a source given twice
    stored = read_stats(write_stats(a, tmp_path / "s"))
    assert stored.parts.equals(a.parts) and as_expected(stored.merge(b, stored)) == EXPECTED


def test_a_run_that_grew_replaces_its_smaller_part(tmp_path):
    """A resumed run keeps its run id and has more rows: merging old and new stats counts the new rows once."""
    early = TaskStats.from_rows([row("ra", 1, s, 1.0) for s in range(2)])
    later = TaskStats.from_rows([row("ra", 1, s, float(s < 2)) for s in range(4)])
    for merged in (early.merge(later), later.merge(early)):
        assert as_expected(merged)[T[1]][:4] == (4, 0, 2.0, 2)


def cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.slow
def test_cli_writes_pushes_and_merges_back_from_a_hub(tmp_path, hub_spec):
    a, b = run_a(tmp_path), run_b(tmp_path)
    first = cli("stats", a, "--out", tmp_path / "s1")
    assert first.exit_code == 0, first.output
    assert re.search(r"arithmetic\s+3\s+12\s+0\.500\s+0\.333", first.output), first.output
    pushed = cli("stats", b, "--merge", tmp_path / "s1", "--push", "org/stats", "--hub", hub_spec)
    assert pushed.exit_code == 0, pushed.output
    ref = re.search(r"pushed: (org/stats@[0-9a-f]{40})", pushed.output).group(1)
    again = cli("stats", a, "--merge", "org/stats", "--hub", hub_spec, "--out", tmp_path / "s2")  # a counted once
    assert again.exit_code == 0, again.output
    assert as_expected(read_stats(tmp_path / "s2")) == EXPECTED
    assert as_expected(load_stats([ref], hub=hub_spec)) == EXPECTED
    same = cli("stats", "--merge", ref, "--merge", tmp_path / "s2", "--push", "org/stats", "--hub", hub_spec)
    assert same.exit_code == 0 and ref in same.output  # the same stats again: no new commit
    manifest = json.loads((tmp_path / "s2" / "stats.json").read_text())
    assert manifest["runs"] == ["ra", "rb"] and manifest["tasks"] == 4 and manifest["schema_version"] == "1.0"
    assert pl.read_parquet(tmp_path / "s2" / "tasks.parquet").height == 4
    assert datasets.load_dataset(str(tmp_path / "s2"), split="train").num_rows == 4  # the card's configs, no hubgym


@pytest.mark.slow
def test_a_band_from_stats_on_a_hub_and_from_rollout_repos(tmp_path, hub_spec):
    from hubgym.hub.rollouts import push_rollouts
    from hubgym.stats import push_stats

    push_stats(TaskStats.from_rollouts(run_a(tmp_path)), "org/stats", hub=hub_spec)
    band = DifficultyBand.from_sources(["org/stats", str(run_b(tmp_path))], 0.1, 0.9, min_samples=2, hub=hub_spec)
    assert [band.pass_rate("arithmetic", t) for t in T] == [0.0, 0.5, 1.0, None]  # task 3: 1 sample < 2
    push_rollouts(tmp_path / "a", "org/rollouts", hub=hub_spec)
    push_rollouts(tmp_path / "b", "org/rollouts", hub=hub_spec)
    result = cli("stats", "org/rollouts", "--hub", hub_spec, "--out", tmp_path / "s")  # every run of the repo
    assert result.exit_code == 0, result.output
    assert as_expected(read_stats(tmp_path / "s")) == EXPECTED
    assert as_expected(load_stats(["org/rollouts:ra", "org/stats", "org/rollouts:rb"], hub=hub_spec)) == EXPECTED
    refused = failure(cli("stats", tmp_path / "b", "--push", "org/rollouts", "--hub", hub_spec))
    assert "org/rollouts on the" in refused and "holds other files (README.md" in refused  # never overwritten

    # a push adds to what the repo holds: run b's stats alone, pushed onto run a's, give both
    push_stats(TaskStats.from_rollouts(tmp_path / "b"), "org/stats", hub=hub_spec)
    assert as_expected(load_stats("org/stats", hub=hub_spec)) == EXPECTED
    push_stats(TaskStats.from_rollouts(tmp_path / "b"), "org/stats", hub=hub_spec, replace=True)
    assert load_stats("org/stats", hub=hub_spec).runs == ["rb"]


def failure(result) -> str:
    assert result.exit_code != 0
    return " ".join(result.output.split())


@pytest.mark.slow
def test_bad_sources_are_one_error_each_and_write_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    assert "no rollout shards (*.arrow) under" in failure(cli("stats", tmp_path / "empty", "--out", out))
    assert "nosuch does not exist" in failure(cli("stats", "nosuch", "--out", out))
    write_stats(TaskStats.from_rollouts(run_a(tmp_path)), tmp_path / "s")
    assert "holds task stats, not rollouts; pass it with --merge" in failure(cli("stats", tmp_path / "s"))
    assert "is not a task-stats dataset (no stats.json)" in failure(cli("stats", "--merge", tmp_path / "a"))
    assert not out.exists()


def test_stats_of_another_schema_version_are_refused(tmp_path):
    write_stats(TaskStats.from_rollouts(run_a(tmp_path)), tmp_path / "s")
    manifest = tmp_path / "s" / "stats.json"
    manifest.write_text(manifest.read_text().replace('"schema_version": "1.0"', '"schema_version": "0.9"'))
    message = failure(cli("stats", run_b(tmp_path), "--merge", tmp_path / "s", "--out", tmp_path / "out"))
    assert "has stats schema version '0.9', this hubgym reads '1.0', so the two cannot be merged" in message
    assert not (tmp_path / "out").exists()
    with pytest.raises(ManifestError, match="cannot be merged"):
        DifficultyBand.from_sources([str(tmp_path / "s")], 0.1, 0.9)


def test_task_ids_checked_against_an_env_name_env_config_split_row_and_field(tmp_path):
    stats = TaskStats.from_rollouts(run_a(tmp_path))
    check_tasks(stats, [with_tasks("arithmetic:easy")], "test")  # its own tasks: fine
    with pytest.raises(EnvContractError) as caught:
        check_tasks(stats, [with_tasks("arithmetic:medium")], "test")
    assert caught.value.where.env == "arithmetic" and caught.value.where.config == "medium"
    assert caught.value.where.split == "test" and caught.value.where.field == "task_id"
    assert caught.value.where.row == min(T[:3])
    message = failure(cli("stats", tmp_path / "a", "--check", "arithmetic:medium", "--out", tmp_path / "out"))
    assert f"stats name task '{min(T[:3])}' of env 'arithmetic', which its config(s) medium do not hold" in message
    assert f"[env='arithmetic' config='medium' split='test' row='{min(T[:3])}' field='task_id']" in message
    assert not (tmp_path / "out").exists()


def test_rows_missing_fields_name_the_row_and_field_and_change_nothing():
    band = DifficultyBand(TaskStats.from_rows([row("ra", 1, s, float(s < 2)) for s in range(4)]), 0.1, 0.9,
                          min_samples=4)
    broken = row("rc", 1, 0, 1.0)
    del broken["task_id"]
    with pytest.raises(EnvContractError) as caught:
        band.update([row("rc", 1, 1, 1.0), broken])
    assert caught.value.where.row == broken["rollout_id"] and caught.value.where.field == "task_id"
    assert band.pass_rate("arithmetic", T[1]) == 0.5  # the good row before it was not counted either
    with pytest.raises(EnvContractError, match="rollout row has no 'reward'"):
        band.update([{k: v for k, v in row("rc", 1, 0, 1.0).items() if k != "reward"}])
    with pytest.raises(ValueError, match=r"^DifficultyBand low=0.9, high=0.1: need 0 <= low <= high <= 1"):
        DifficultyBand(None, 0.9, 0.1)


def band_catalog() -> TaskStats:
    """Pass rates 0 (task 0), 0.5 (task 1), 1 (task 2), and task 3 with 2 samples only."""
    rows = [row("s", t, s, float(s < k)) for t, k in ((0, 0), (1, 4), (2, 8)) for s in range(8)]
    return TaskStats.from_rows(rows + [row("s", 3, s, 0.0) for s in range(2)])


def test_sampling_through_the_band_follows_the_stats():
    band = DifficultyBand(band_catalog(), low=0.1, high=0.9, min_samples=4)
    unknown = TASKS[5]["id"]
    catalog = [*T, unknown]
    assert [band.keep("arithmetic", t) for t in catalog] == [False, True, False, True, True]
    rng = random.Random(0)
    drawn = [t for t in (rng.choice(catalog) for _ in range(500)) if band.keep("arithmetic", t)]
    assert set(drawn) == {T[1], T[3], unknown}  # the band, the under-sampled task and the unknown one (explore)
    assert band.keep("reverse_text", T[0])  # the same id under another env is another task: unknown

    # the policy masters task 1 (8 more passes: 12/16 = 0.75, still in), then fails task 2 (16 fails: 8/24 in band)
    band.update([row("p1", 1, s, 1.0) for s in range(8)])
    assert band.pass_rate("arithmetic", T[1]) == 0.75 and band.keep("arithmetic", T[1])
    band.update([row("p2", 2, s, 0.0) for s in range(16)])
    assert band.pass_rate("arithmetic", T[2]) == pytest.approx(8 / 24) and band.keep("arithmetic", T[2])
    band.update([row("p1", 1, s, 1.0) for s in range(8)])  # the same rollouts again: not counted twice
    band.update([row("s", 0, s, 1.0) for s in range(8, 12)])  # a run the stored stats counted for task 0: skipped
    assert band.pass_rate("arithmetic", T[1]) == 0.75 and band.pass_rate("arithmetic", T[0]) == 0.0
    band.update([row("p3", 1, s, 1.0) for s in range(16)])  # 28/32 = 0.875 in; then 8 more: 36/40 = 0.9 in, ...
    band.update([row("p4", 1, s, 1.0) for s in range(8)])
    assert band.pass_rate("arithmetic", T[1]) == 0.9 and band.keep("arithmetic", T[1])
    band.update([row("p5", 1, s, 1.0) for s in range(10)])  # 46/50 = 0.92: out
    assert not band.keep("arithmetic", T[1])


def test_decay_weighs_recent_rollouts_more():
    band = DifficultyBand(band_catalog(), 0.1, 0.9, min_samples=4, decay=0.5)
    band.update([row("p1", 2, s, 0.0) for s in range(8)])  # task 2: 8 passes of 8, halved, then 8 fails
    assert band.pass_rate("arithmetic", T[2]) == pytest.approx(4 / 12) and band.keep("arithmetic", T[2])
