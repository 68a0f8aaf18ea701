"""Rollout runs on a hub (local folder and the loopback Hub-API server): push, resume, stream, re-score."""

from __future__ import annotations

import datetime as dt
import json
import os

import datasets
import pytest

from hubgym.builders.build import build_tasks
from hubgym.builders.registry import resolve_env
from hubgym.errors import HubConnectionError
from hubgym.hub import HfHub
from hubgym.hub.base import get_hub
from hubgym.hub.rollouts import ShardError, iter_rollout_rows, push_rollouts
from hubgym.rollout.writer import ShardWriter
from hubgym.schemas import assistant
from hubgym.score.rescore import rescore

pytest_plugins = ["hub_server"]
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")
TOKEN = "hf_loopbackSecretToken123456"


def make_run(folder, run_id: str, groups: int = 6, n: int = 2, per_shard: int = 4):
    """A run folder of scored arithmetic rollouts (answers right for sample 0, wrong otherwise)."""
    verifier = resolve_env("arithmetic").verifier()
    tasks = build_tasks("arithmetic", "easy")["test"]
    writer = ShardWriter(folder, "w000of001", max_rows=per_shard)
    for g in range(groups):
        task, rows = tasks[g % len(tasks)], []
        for s in range(n):
            answer = task["info"]["answer"] if s == 0 else "999"
            completion = [assistant(f"<answer>{answer}</answer>")]
            score = verifier.score(task, completion)
            rows.append({
                "rollout_id": f"{run_id}-{g}-{task['id']}-{s}", "run_id": run_id, "task_id": task["id"],
                "env": "arithmetic", "group": f"{run_id}-{g}-{task['id']}", "sample": s, "prompt": task["prompt"],
                "completion": completion, "info": task["info"], "interaction": task["interaction"],
                "prompt_ids": [1, 2, 3], "completion_ids": [4, 5], "completion_mask": [1, 1],
                "completion_logprobs": [-0.5, -0.5], "tokens_consistent": True, "reward": score.reward,
                "metrics": [{"name": f"reward/{k}", "value": v} for k, v in score.components.items()],
                "finish_reason": "stop", "truncated": False, "num_turns": 1, "error": None,
                "provenance": {"model": "m", "policy_version": 0, "sampling": "{}", "env_repo": None,
                               "env_revision": None, "verifier_module": verifier.name,
                               "verifier_sha256": verifier.sha256, "engine": "vllm", "engine_version": "0",
                               "chat_template_sha256": None},
                "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0},
                "created_at": dt.datetime.now(dt.timezone.utc)})
        writer.add_group(rows)
    writer.flush()
    writer.write_manifest({"run_id": run_id, "model": "m", "policy_version": 0, "sampling": {},
                           "envs": {"arithmetic": {"config": "easy", "tasks": groups}}})
    return folder


@pytest.fixture
def http_hub(hub_client, tmp_path, monkeypatch):
    hub_client.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return HfHub(cache_dir=tmp_path / "snapshots", backoff_s=0.01)


@pytest.fixture(params=["local", "http"])
def hub(request, tmp_path):
    return get_hub(tmp_path / "hub") if request.param == "local" else request.getfixturevalue("http_hub")


def ids(rows) -> list[str]:
    return sorted(r["rollout_id"] for r in rows)


def test_push_two_runs_then_stream_them_back(hub, tmp_path):
    a, b = make_run(tmp_path / "a", "runa"), make_run(tmp_path / "b", "runb", groups=3)
    first = push_rollouts(a, "org/rollouts", hub=hub)
    assert (first.name, first.rows, first.uploaded, first.skipped) == ("runa", 12, 3, 0)
    again = push_rollouts(a, "org/rollouts", hub=hub)
    assert (again.uploaded, again.skipped) == (0, 3)  # nothing uploaded twice
    push_rollouts(b, "org/rollouts", hub=hub, name="second")
    snapshot = hub.resolve("org/rollouts")
    card = (snapshot.path / "README.md").read_text()
    assert "config_name: runa" in card and "config_name: second" in card and "mean reward 0.500" in card
    mine = ids(iter_rollout_rows(["org/rollouts:runa"], hub=hub))
    assert mine == ids(iter_rollout_rows([a])) and len(mine) == 12
    assert len(list(iter_rollout_rows(["org/rollouts"], hub=hub))) == 12 + 6  # every run
    if isinstance(hub, HfHub):  # datasets streams the run straight from the Hub API
        urls, kwargs = hub.stream_urls(snapshot, [f"runa/shards/{p.name}" for p in sorted((a / "shards").iterdir())])
        streamed = datasets.load_dataset("arrow", data_files=urls, split="train", streaming=True, **kwargs)
    else:
        streamed = datasets.load_dataset(str(snapshot.path), "runa", split="train", streaming=True)
    assert ids(streamed) == mine


def test_an_interrupted_upload_resumes_with_no_duplicate(http_hub, hub_client, tmp_path):
    run = make_run(tmp_path / "run", "runa", groups=6, per_shard=2)  # 6 shards
    hub_client.drop("commit", 100, skip=2)  # the first two shard commits land, then the Hub keeps dropping
    with pytest.raises(HubConnectionError):
        push_rollouts(run, "org/rollouts", hub=http_hub, shards_per_commit=1)
    hub_client.faults.clear()  # the Hub is back
    done = push_rollouts(run, "org/rollouts", hub=http_hub, shards_per_commit=1)
    assert done.skipped == 2 and done.uploaded == 4
    rows = list(iter_rollout_rows(["org/rollouts:runa"], hub=http_hub))
    assert ids(rows) == ids(iter_rollout_rows([run])) and len(set(ids(rows))) == 12


def test_a_truncated_shard_is_never_published_and_a_corrupted_one_is_named(tmp_path):
    hub = get_hub(tmp_path / "hub")
    run = make_run(tmp_path / "run", "runa", per_shard=4)
    shards = sorted((run / "shards").glob("*.arrow"))
    good = shards[0].read_bytes()
    shards[0].write_bytes(good[: len(good) // 2])
    with pytest.raises(ShardError, match=r"w000of001-00000\.arrow is truncated or corrupted"):
        push_rollouts(run, "org/rollouts", hub=hub)
    assert not hub.exists("org/rollouts") or not list(iter_rollout_rows(["org/rollouts"], hub=hub))
    shards[0].write_bytes(good)
    push_rollouts(run, "org/rollouts", hub=hub)
    stored = next(hub.resolve("org/rollouts").path.glob("runa/shards/*00001.arrow"))
    os.chmod(stored, 0o644)
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: Arrow may still open it, the sha256 will not match
    stored.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=r"runa/shards/w000of001-00001\.arrow .* does not match its sha256"):
        list(iter_rollout_rows(["org/rollouts:runa"], hub=hub))
    counts: dict = {}
    rest = list(iter_rollout_rows(["org/rollouts:runa"], hub=hub, skip_bad=True, counts=counts))
    assert counts == {"bad_shards": 1} and len(rest) == 12 - 4  # the other shards are still readable


def test_rescore_from_the_hub_with_a_changed_verifier(hub, tmp_path):
    run = make_run(tmp_path / "run", "runa")
    pushed = push_rollouts(run, "org/rollouts", hub=hub)
    same = rescore([pushed.ref], hub=hub, workers=1)
    assert (same.rows, same.changed) == (12, 0)
    changed_verifier = tmp_path / "arith_v2.py"
    changed_verifier.write_text(
        "from hubgym.verifiers.arithmetic import formatted\n"
        "def lenient(task, completion):\n    return 1.0\n"
        "REWARDS = {lenient: 1.0, formatted: 0.0}\nREWARD_RANGE = (0.0, 1.0)\n")
    result = rescore([pushed.ref], hub=hub, verifier=str(changed_verifier), workers=2, out=tmp_path / "v2")
    assert result.changed == 6  # every wrong answer now scores 1
    total = result.diff.filter(result.diff["component"] == "*").row(0, named=True)
    assert (total["changed"], total["mean_old"], total["mean_new"]) == (6, 0.5, 1.0)
    assert set(result.diff["component"]) == {"*", "correct", "formatted", "lenient"}
    written = list(iter_rollout_rows([tmp_path / "v2"]))
    assert {r["rescore_reward"] for r in written} == {1.0} and {r["reward"] for r in written} == {0.0, 1.0}
    assert all(r["rescore_verifier_module"] and json.dumps(r["info"]) for r in written)
