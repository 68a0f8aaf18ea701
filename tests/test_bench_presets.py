"""The GPU benchmark's smollm2-135m preset is SmolLM2-135M-Instruct's architecture: its MFU and tokens/s stand
for that model only while the preset's config matches the real model's config.json (weights aside)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size", "tie_word_embeddings", "hidden_act", "rms_norm_eps")


@pytest.fixture(scope="module")
def bench_mfu():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_mfu
    finally:
        sys.path.remove(str(BENCH))
    return bench_mfu


@pytest.mark.slow
def test_smollm2_preset_is_the_real_architecture(bench_mfu, smollm2_model):
    from transformers import AutoConfig, AutoModelForCausalLM

    real = json.loads((Path(smollm2_model) / "config.json").read_text())
    model_type, values = bench_mfu.PRESETS["smollm2-135m"]
    preset = AutoConfig.for_model(model_type, **values)
    assert model_type == real["model_type"]
    for key in SHAPE_KEYS:
        assert getattr(preset, key) == pytest.approx(real[key]), key
    assert preset.rope_parameters["rope_theta"] == real["rope_parameters"]["rope_theta"]
    with torch.device("meta"):  # the parameter count the MFU's FLOPs are made of, without allocating weights
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(preset).parameters())
    assert params == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(smollm2_model).parameters())
    assert round(params / 1e6, 1) == 134.5
