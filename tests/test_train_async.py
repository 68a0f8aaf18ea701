"""Rollouts sampled one step ahead of training (`online.async_steps=1`), weights synced every 3 steps.

The rollouts of step t are planned while step t-1 trains, so they are sampled by the weights synced
last before that: steps 0-2 by version 0 (syncs at steps 0 and 3), step 3 by version 2, synced at the
checkpoint after step 1 (a resumed run could only serve those weights, so the straight run does too).
A run interrupted right after that checkpoint and started again trains on the very same rollouts and
ends with the same weights: the checkpoint waits for the rollouts already planned, and the order of
engine jobs fixes which weights sample which step. One vLLM engine serves all three runs.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from hubgym.hub.rollouts import iter_rollouts
from hubgym.engines import VLLMEngine
from hubgym.train.config import TINY_CONFIG, load_config
from hubgym.train.trainer import Trainer

pytestmark = pytest.mark.slow
STEPS = 4


class Interrupted(Exception):
    """Stands in for a kill right after the checkpoint of step 1."""


@pytest.fixture(scope="module")
def engine(tiny_model):
    engine = VLLMEngine(str(tiny_model), max_model_len=512, seed=0, separate_core=True)
    yield engine
    engine.close()


def config(model, out):
    return load_config(TINY_CONFIG, [f"model={model}", f"output_dir={out}", f"online.steps={STEPS}",
                                     "online.async_steps=1", "online.sync_every=3",
                              "checkpoint_every=2", "eval.limit=0", "log.every=1000", "batch.groups_per_step=2",
                              "grpo.n=4", "grpo.zero_variance=keep"])


def train(model, out, engine):
    trainer = Trainer(config(model, out), engine=engine)
    try:
        return trainer.run()
    finally:
        trainer.close()


def sampled(out) -> dict[str, tuple[int, list[int]]]:
    """rollout_id -> (policy_version, completion ids) of every online rollout of a run."""
    rows = {}
    for row in iter_rollouts([out / "online"]):
        assert row["rollout_id"] not in rows, f"rollout {row['rollout_id']} stored twice"
        rows[row["rollout_id"]] = (row["provenance"]["policy_version"], list(row["completion_ids"]))
    return rows


def test_rollouts_one_step_ahead_lag_one_version_and_resume_exactly(tiny_model, tmp_path, engine, monkeypatch):
    straight = train(tiny_model, tmp_path / "straight", engine)
    lines = [json.loads(line) for line in straight.metrics_file.read_text().splitlines()]
    steps = [line for line in lines if "policy/loss" in line]
    assert [line["step"] for line in steps] == list(range(STEPS))
    assert [line["policy/staleness_max"] for line in steps] == [0, 1, 2, 1]
    assert all(line["time/wait_s"] >= 0 and line["time/generate_s"] > 0 for line in steps)
    manifests = sorted((tmp_path / "straight" / "online").glob("manifest-step*.json"))
    versions = [json.loads(m.read_text())["policy_version"] for m in manifests]
    assert versions == [0, 0, 0, 2]

    checkpoint = Trainer._checkpoint

    def checkpoint_then_stop(self, step):
        checkpoint(self, step)
        if step == 1:
            raise Interrupted

    monkeypatch.setattr(Trainer, "_checkpoint", checkpoint_then_stop)
    with pytest.raises(Interrupted):
        train(tiny_model, tmp_path / "resumed", engine)
    monkeypatch.setattr(Trainer, "_checkpoint", checkpoint)
    at_stop = sorted((tmp_path / "resumed" / "online").glob("manifest-step*.json"))
    assert len(at_stop) == 3  # steps 0 and 1 trained, step 2's rollouts (planned ahead) on disk too
    train(tiny_model, tmp_path / "resumed", engine)

    rollouts = sampled(tmp_path / "straight")
    assert len(rollouts) == STEPS * 2 * 4
    assert sampled(tmp_path / "resumed") == rollouts  # the same rollouts, none twice, none missing
    a = load_file(str(tmp_path / "straight" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
