"""The full round trip, on the loopback Hub-API server and on a local hub folder:
push env -> load_dataset -> vLLM rollouts of the hub env -> push shards -> stream back -> re-score with a changed
verifier -> diff report."""

from __future__ import annotations

import datasets
import pytest

from hubgym.envs import push_env
from hubgym.hub.factory import get_hub
from hubgym.hub.rollouts import iter_rollouts, push_rollouts
from hubgym.engines import SamplingArgs
from hubgym.rollout import RolloutConfig, run_rollouts
from hubgym.score.rescore import plot_diff, rescore

from helpers.hub_server import TOKEN

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


@pytest.fixture(scope="module")
def engine(tiny_model):
    from hubgym.engines import VLLMEngine

    engine = VLLMEngine(str(tiny_model), max_model_len=512)
    yield engine
    engine.close()


def test_round_trip(hub_spec, engine, tiny_model, tmp_path):
    pushed = push_env("arithmetic", "org/arith", hub=hub_spec, configs=["easy"],
                      overrides={"sizes": {"train": 6, "test": 4}})
    hub = get_hub(hub_spec)
    if hub.name == "local":
        tasks = datasets.load_dataset(str(hub.resolve("org/arith").path), "easy", split="test")
    else:
        tasks = datasets.load_dataset("org/arith", "easy", split="test", token=TOKEN,
                                      cache_dir=str(tmp_path / "ds"))
    assert len(tasks) == 4

    run = tmp_path / "run"
    config = RolloutConfig(envs=[f"{pushed.ref}:easy"], model=str(tiny_model), out=str(run), n=2, split="test",
                           sampling=SamplingArgs(max_tokens=8, regex=r"<answer>[0-9]{1,2}</answer>"),
                           max_model_len=512, hub=hub_spec, trust=True)
    assert run_rollouts(config, engine=engine, progress=False).written == 8

    shards = push_rollouts(run, "org/rollouts", hub=hub_spec, name="r1")
    rows = list(iter_rollouts([shards.ref], hub=hub_spec))
    assert len(rows) == 8
    assert {(r["provenance"]["env_repo"], r["provenance"]["env_revision"]) for r in rows} == {
        ("org/arith", pushed.revision)}
    rewards = {r["rollout_id"]: r["reward"] for r in rows}
    formatted = sum(m["value"] for r in rows for m in r["metrics"] if m["name"] == "reward/formatted")
    assert formatted >= 1

    changed = tmp_path / "arith_v2.py"
    changed.write_text("from hubgym.verifiers.arithmetic import correct, formatted\n"
                       "def shaped(tasks, completions):\n    return [0.5 * f for f in formatted(tasks, completions)]\n"
                       "BATCH_REWARDS = {correct: 1.0, formatted: 0.0, shaped: 1.0}\nREWARD_RANGE = (0.0, 2.0)\n")
    result = rescore([shards.ref], hub=hub_spec, verifier=str(changed), out=tmp_path / "v2", workers=1)
    assert result.rows == 8 and result.changed == formatted  # each formatted reply gains 0.5, no other changes
    total = result.diff.filter(result.diff["component"] == "*").row(0, named=True)
    assert total["mean_new"] == pytest.approx(total["mean_old"] + 0.5 * formatted / 8)
    assert total["mean_old"] == pytest.approx(sum(rewards.values()) / 8)
    assert "shaped" in set(result.diff["component"])
    assert plot_diff(result, tmp_path / "diff.png").stat().st_size > 0
