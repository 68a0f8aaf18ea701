"""A real run of envs whose rewards are batch rewards (rollout groups scored as batches, against the instant
server): every stored reward is what its row scores alone, and a re-score (record batches) reproduces them all."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from hubgym.engines import SamplingArgs
from hubgym.envs import resolve_env
from hubgym.rollout import RolloutConfig, run_rollouts
from hubgym.rollout.instant_server import InstantServer
from hubgym.score import rescore

ENVS = ["arithmetic:easy", "reverse_text"]


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    """{env: run folder}: 6 tasks x 3 samples of each env, scored a group at a time."""
    folder = tmp_path_factory.mktemp("batch-runs")
    with InstantServer(tiny_model, log_path=folder / "server.log") as server:
        out = {}
        for spec in ENVS:
            env = spec.split(":")[0]
            config = RolloutConfig(envs=[spec], model=server.model, out=str(folder / env), engine="openai", n=3,
                                   limit=6, split="train", base_url=server.url(spec), max_model_len=1024,
                                   sampling=SamplingArgs(max_tokens=64), concurrency=2)
            assert run_rollouts(config, progress=False).written == 18
            out[env] = folder / env
    return out


def stored(run) -> list[dict]:
    return pa.concat_tables(pa.ipc.open_file(str(p)).read_all()
                            for p in sorted((run / "shards").glob("*.arrow"))).to_pylist()


@pytest.mark.slow
@pytest.mark.parametrize("env", [spec.split(":")[0] for spec in ENVS])
def test_each_stored_reward_is_what_its_row_scores_alone(runs, env):
    verifier = resolve_env(env).verifier()
    assert verifier.batch_rewards and not verifier.rewards  # the env's rewards are batch rewards
    rows = stored(runs[env])
    for row in rows:
        task = {"id": row["task_id"], "env": env, "prompt": row["prompt"], "interaction": row["interaction"],
                "info": json.loads(row["info"]) if isinstance(row["info"], str) else row["info"]}
        alone = verifier.score(task, row["completion"])
        assert row["error"] is None and row["reward"] == alone.reward
        metrics = {m["name"]: m["value"] for m in row["metrics"] if m["name"].startswith("reward/")}
        assert metrics == {f"reward/{name}": value for name, value in alone.components.items()}
    assert len({row["reward"] for row in rows}) > 1  # the replies earn different rewards: the check can fail
    groups = {}
    for row in rows:  # a group is scored in one call: its rows share that call's time
        groups.setdefault(row["group"], set()).add(row["timings"]["score_s"])
    assert len(groups) == 6 and all(len(times) == 1 for times in groups.values())


@pytest.mark.slow
@pytest.mark.parametrize("env", [spec.split(":")[0] for spec in ENVS])
def test_a_rescore_of_the_run_reproduces_every_stored_reward(runs, env):
    result = rescore(runs[env], workers=1)
    assert (result.rows, result.changed, int(result.counts["rescore_errors"].sum())) == (18, 0, 0)
