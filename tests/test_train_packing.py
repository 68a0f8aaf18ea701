"""Padding-free packing: several sequences to a row, position ids restarting with each, attention kept within
each. A packed micro-batch gives every token the logprob the sequence alone gives it (the tiny Qwen2 model and a
SmolLM2-shaped Llama), the step's loss and gradients do not depend on the packing, and the layout keeps the
budget while holding tokens rather than padding."""

from __future__ import annotations

import pytest
import torch

from hubgym.train.loss import LossSettings, make_loss_fn, token_logprobs
from hubgym.train.packing import pack_step, plan_rows

from helpers.train_inputs import small_llama, varied_groups


@pytest.fixture(params=["tiny", "llama"])
def causal_lm(request, tiny_model):
    from transformers import AutoModelForCausalLM

    if request.param == "tiny":
        return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    return small_llama()


def test_the_layout_keeps_the_budget_and_fills_rows_with_tokens():
    lengths = [100, 60, 40, 30, 30, 20, 95, 5]
    plans = plan_rows(lengths, max_tokens=200)
    placed = sorted(i for plan in plans for row in plan.rows for i in row)
    assert placed == list(range(len(lengths)))  # each sequence once
    for plan in plans:
        assert len(plan.rows) * plan.width <= 200
        assert plan.width == max(lengths[i] for row in plan.rows for i in row)  # as wide as its longest
        assert all(sum(lengths[i] for i in row) <= plan.width for row in plan.rows)
    assert any(len(row) > 1 for plan in plans for row in plan.rows)
    padded = sum(len(plan.rows) * plan.width for plan in plans) - sum(lengths)
    assert padded < 0.1 * sum(lengths)
    assert plans == plan_rows(lengths, max_tokens=200)  # deterministic


@pytest.mark.slow
def test_packed_logprobs_equal_each_sequence_alone(causal_lm):
    model = causal_lm.eval()
    [[mb]] = pack_step(varied_groups(16), max_tokens=10_000)
    assert mb.position_ids is not None and mb.input_ids.shape[0] < len(mb.rollout_ids)  # rows shared
    with torch.no_grad():
        logp, _ = token_logprobs(model, mb, positions=mb.next_token_positions())
    for i in range(len(mb.rollout_ids)):
        row, cols = mb.span(i)
        ids = mb.input_ids[row:row + 1, cols]
        with torch.no_grad():
            alone = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        assert torch.allclose(logp[row, cols.start:cols.stop - 1], alone, atol=1e-5), mb.rollout_ids[i]
    if cols.stop < mb.input_ids.shape[1]:  # nothing is read across a boundary or from the padding
        assert torch.all(logp[row, cols.stop - 1:] == 0.0)


@pytest.mark.slow
def test_the_steps_loss_and_gradients_do_not_depend_on_the_packing(causal_lm):
    model = causal_lm
    groups = varied_groups(16)
    cfg = LossSettings(variant="grpo")

    def step(max_tokens: int) -> tuple[float, list[torch.Tensor], list[bool]]:
        model.zero_grad()
        batches = pack_step(groups, max_tokens)[0]
        value = 0.0
        for mb in batches:
            loss, _ = make_loss_fn(cfg)(model, mb)
            loss.backward()
            value += loss.item()
        return value, [p.grad.clone() for p in model.parameters()], [mb.position_ids is not None for mb in batches]

    packed, packed_grads, packed_layout = step(10_000)
    alone, alone_grads, alone_layout = step(43)  # the longest sequence's length: few rows are shared
    assert packed_layout == [True] and len(alone_layout) > 2 and packed != 0.0
    assert alone == pytest.approx(packed, rel=1e-5)
    for a, b in zip(alone_grads, packed_grads):
        assert torch.allclose(a, b, atol=1e-5)
