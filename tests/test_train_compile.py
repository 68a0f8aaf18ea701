"""optim.compile: the config reaches DeepSpeedSettings, and the compiled decoder trains to the same loss and
gradients as the eager one."""

from __future__ import annotations

import pytest
import torch

from hubgym.train.config import ConfigError, load_config
from hubgym.train.trainer import deepspeed_settings


def test_optim_compile_is_an_option_that_reaches_deepspeed():
    assert deepspeed_settings(load_config(None)).compile is False
    assert deepspeed_settings(load_config(None, ["optim.compile=true"])).compile is True
    with pytest.raises(ConfigError, match="optim.compile"):
        load_config(None, ["optim.compile=sometimes"])


@pytest.mark.slow
def test_a_compiled_decoder_gives_the_eager_loss_and_gradients(tiny_model):
    from transformers import AutoModelForCausalLM

    from hubgym.train.engine import compile_decoder
    from hubgym.train.loss import LossSettings, make_loss_fn
    from hubgym.train.packing import pack_step
    from helpers.train_inputs import varied_groups

    eager, compiled = (AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32) for _ in range(2))
    compile_decoder(compiled)
    assert compiled.get_decoder()._compiled_call_impl is not None
    mb = pack_step(varied_groups(16), max_tokens=43)[0][0]  # one sequence to a row: one graph to compile
    results = []
    for model in (eager, compiled):
        loss, _ = make_loss_fn(LossSettings(variant="dapo"))(model, mb)
        loss.backward()
        results.append((loss.item(), [p.grad for p in model.parameters()]))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5) and results[0][0] != 0.0
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, atol=1e-5)
