"""GRPO on the real stack (vLLM rollouts, weight sync, DeepSpeed) makes the tiny model better at an env.

The env is `arithmetic:tiny` (the 25 sums of 0..4). The untrained random model never answers one
right; after 50 online steps it does, measured on 100 seeded evaluation rollouts. What it learns
is mostly the answer format and the likeliest sums, which is what a 0.4M-parameter model can
learn in a couple of minutes; the assertion is on reward, never on time.
"""

from __future__ import annotations

import json

import pytest

from hubgym.hub.rollouts import iter_rollouts

from hubgym.train.config import TINY_CONFIG, load_config
from hubgym.train.trainer import Trainer

pytestmark = pytest.mark.slow


def test_online_grpo_raises_the_reward_well_beyond_noise(tiny_model, tmp_path):
    cfg = load_config(TINY_CONFIG, [f"model={tiny_model}", f"output_dir={tmp_path}", "online.steps=50",
                                    "optim.lr=3e-3", "eval.limit=25", "eval.n=4", "log.every=1000"])
    trainer = Trainer(cfg)
    try:
        result = trainer.run()
    finally:
        trainer.close()
    before, after = result.before["eval/arithmetic/reward"], result.after["eval/arithmetic/reward"]
    assert before <= 0.02
    assert after >= before + 0.08  # >= 8 more right answers out of 100 (sd of the estimate ~0.03)
    assert result.counts["weight_syncs"] >= 50
    history = [line for line in result.metrics_file.read_text().splitlines() if '"policy/is_ratio_mean"' in line]
    assert len(history) >= 25  # steps that had a trainable group
    assert result.plot is not None and result.plot.stat().st_size > 0
    assert (result.model_dir / "model.safetensors").exists()
    ratios = [json.loads(line)["policy/is_ratio_mean"] for line in history]
    assert abs(sum(ratios) / len(ratios) - 1.0) < 0.02  # fresh data: vLLM's logprobs are the trainer's
    by_step: dict[str, int] = {}  # run id -> policy_version (each step is its own run id)
    for row in iter_rollouts([tmp_path / "online"]):
        by_step.setdefault(row["run_id"], row["provenance"]["policy_version"])
    manifests = sorted((tmp_path / "online").glob("manifest-step*.json"))
    versions = [json.loads(m.read_text())["policy_version"] for m in manifests]
    assert sorted(by_step.values()) == sorted(versions)  # every row carries its step's policy_version
    assert versions == sorted(versions) and versions[-1] == 49  # policy_version rises with the synced weights
