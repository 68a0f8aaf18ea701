"""LoRA on the real trainer (the tiny Qwen2, DeepSpeed ZeRO-2): only the adapters train, the KL reference is the
base model, checkpoints hold the adapters, and vLLM -- given the merged weights under the base names -- samples
the trained policy, not the base model."""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from hubgym.train.batch import MicroBatch
from hubgym.train.config import TINY_CONFIG, ConfigError, load_config
from hubgym.train.lora import LoraSettings, wrap_lora
from hubgym.train.sync import sync_weights
from hubgym.train.trainer import Trainer

from helpers.logprobs import TOL, vllm_logprobs
from helpers.scored_runs import contrasting_run

pytestmark = pytest.mark.slow
STEPS = 4


@pytest.fixture(scope="module")
def lora_run(tiny_model, tmp_path_factory):
    """A finished LoRA run with a KL term on stored rollouts: (trainer, its logged steps, output folder)."""
    tmp = tmp_path_factory.mktemp("lora")
    rollouts = contrasting_run(tmp / "rollouts")
    cfg = load_config(TINY_CONFIG, [f"model={tiny_model}", f"output_dir={tmp / 'out'}", f"offline.sources=[{rollouts}]",
                                    f"offline.steps={STEPS}", "eval.limit=0", "batch.groups_per_step=4", "grpo.n=2",
                                    "loss.beta=0.1", "optim.lr=2e-2", "lora.r=4", "lora.alpha=8", "log.every=1000"])
    trainer = Trainer(cfg, console=Console(file=io.StringIO()))
    try:
        result = trainer.run()
    finally:
        trainer.close()
    steps = [r for r in map(json.loads, result.metrics_file.read_text().splitlines()) if "policy/loss" in r]
    return trainer, steps, tmp / "out"


def base_weights(model_dir) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def test_only_the_adapters_train_and_the_reference_is_the_base_model(lora_run, tiny_model):
    trainer, steps, out = lora_run
    module = trainer.policy.module
    trained = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert any(p.abs().max() > 0 for n, p in module.named_parameters() if ".lora_B." in n)  # B starts at 0
    base = base_weights(tiny_model)
    frozen = [(n.removeprefix("base_model.model.").replace(".base_layer.", "."), p)
              for n, p in module.named_parameters() if ".lora_" not in n]
    assert len(frozen) >= len(base) - 1  # every base weight (a tied head is the embedding)
    for key, param in frozen:
        assert torch.equal(param.detach().float(), base[key]), key  # frozen: still the model folder's
    kl = [r["policy/kl"] for r in steps]
    assert [r["policy/skipped"] for r in steps] == [0.0] * STEPS
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and min(kl[1:]) > 1e-4, kl  # the reference: the adapters off
    states = torch.load(next((out / "checkpoints").glob("step-*/*model_states.pt")), weights_only=False)["module"]
    # The checkpoint holds the adapters, plus the tied head: DeepSpeed drops frozen parameters by their first name
    # only, and the head is the embedding's second name.
    assert {k for k in states if ".lora_" not in k} == {"base_model.model.lm_head.weight"} and len(states) > 1
    exported = load_file(str(out / "model" / "model.safetensors"))  # merged, under the base names
    assert set(exported) <= set(base) | {"lm_head.weight"}
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (exported[q] - base[q]).abs().max() > 1e-4


def test_vllm_samples_the_trained_lora_policy(lora_run, tiny_model, tmp_path):
    from hubgym.engines import VLLMEngine

    trainer, _, _ = lora_run
    engine = VLLMEngine(str(tiny_model), max_model_len=512, separate_core=True)
    try:
        ids = engine.tokenizer.encode("What is 2 + 3?") + [40, 41, 42, 43]  # a completion the run trained on
        base = vllm_logprobs(engine, ids)[0]
        sync_weights(engine, trainer.policy.full_state_dict(), 1, tmp_path)  # merged on the fly, in memory
        served = vllm_logprobs(engine, ids)[0]
    finally:
        engine.close()
    ones = torch.ones(1, len(ids), dtype=torch.long)
    batch = MicroBatch(input_ids=torch.tensor([ids]), attention_mask=ones, loss_mask=ones.float(),
                       old_logprobs=ones.float() * 0, advantages=torch.zeros(1), weights=torch.ones(1))
    policy = trainer.policy.logprobs(batch)[0].tolist()  # the peft model itself, adapters applied
    assert served == pytest.approx(policy, abs=TOL)
    assert max(abs(a - b) for a, b in zip(served, base)) > 10 * TOL


def test_target_modules_that_match_nothing_are_one_line(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with pytest.raises(ConfigError) as caught:
        wrap_lora(model, LoraSettings(r=4, target_modules=("q_proj", "qkv")))
    message = str(caught.value)
    assert "lora.target_modules ['qkv']" in message and "q_proj" in message and "gate_proj" in message
    assert "\n" not in message
