"""The GRPO loss against values worked out by hand from the formulas in hubgym/train/loss.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hubgym.train.batch import MicroBatch
from hubgym.train.loss import LossSettings, policy_loss, token_logprobs


def batch(mask_rows, mu_rows, adv, *, num_sequences=None, num_tokens=None, versions=None, weights=None):
    """A micro-batch whose per-token tensors are given at target positions 1..T-1 (position 0 is the prompt)."""
    b, t = len(mask_rows), len(mask_rows[0]) + 1
    pad = lambda rows: torch.tensor([[0.0] + list(r) for r in rows])  # noqa: E731
    return MicroBatch(
        input_ids=torch.zeros((b, t), dtype=torch.long), attention_mask=torch.ones((b, t), dtype=torch.long),
        loss_mask=pad(mask_rows), old_logprobs=pad(mu_rows), advantages=torch.tensor(adv, dtype=torch.float32),
        policy_version=torch.tensor(versions or [0] * b), weights=torch.tensor(weights or [1.0] * b),
        num_sequences=num_sequences or b, num_tokens=num_tokens or int(sum(map(sum, mask_rows))))


# Two sequences: lengths 2 and 1 (loss tokens), positive and negative advantage.
LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -9.0, -9.0]])
MU = [[-1.2, -1.5, 0.0], [-0.1, 0.0, 0.0]]
MASK = [[1, 1, 0], [1, 0, 0]]
ADV = [1.0, -0.5]
# token losses by hand: r = exp(logp - mu); A > 0: -min(r, clip(r)) * A; A < 0: -max(min(rA, clip(r)A), cap*A)
R = [math.exp(0.2), math.exp(-0.5), math.exp(-0.2)]  # 1.2214 (inside the clip), 0.6065 (inside), 0.8187 (inside)
L00, L01, L10 = -R[0] * 1.0, -R[1] * 1.0, -(R[2] * -0.5)


@pytest.mark.parametrize("variant, expected", [
    ("grpo", ((L00 + L01) / 2 + L10 / 1) / 2),  # per-sequence mean, then mean over 2 sequences
    ("dapo", (L00 + L01 + L10) / 3),  # token mean over 3 loss tokens
    ("dr_grpo", (L00 + L01 + L10) / (2 * 8)),  # sum / (N * L) with L = 8
])
def test_aggregation_variants(variant, expected):
    loss, metrics = policy_loss(LOGP, batch(MASK, MU, ADV), LossSettings(variant=variant, dr_grpo_length=8))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["policy/clip_frac"] == 0.0


def test_clip_high_and_low_and_the_dual_clip_cap():
    logp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(4.0)]])
    mu = [[0.0, 0.0, 0.0]]
    cfg = LossSettings(variant="dapo", epsilon_low=0.2, epsilon_high=0.28, is_cap=2.0)
    # token 0, A=+1, r=1.5: clipped at 1.28 -> -1.28
    loss, m = policy_loss(logp[:, :1], batch([[1]], [[0.0]], [1.0]), cfg)
    assert loss.item() == pytest.approx(-1.28) and m["policy/clip_frac_high"] == 1.0
    # token 1, A=-1, r=0.5: min(-0.5, -0.8) = -0.8 -> loss 0.8 (clipped low)
    loss, m = policy_loss(logp[:, 1:2], batch([[1]], [[0.0]], [-1.0]), cfg)
    assert loss.item() == pytest.approx(0.8) and m["policy/clip_frac_low"] == 1.0
    # token 2, A=-1, r=4: min(-4, -1.28) = -4, dual clip max(-4, -2) = -2 -> loss 2
    loss, m = policy_loss(logp[:, 2:], batch([[1]], [[0.0]], [-1.0]), cfg)
    assert loss.item() == pytest.approx(2.0) and m["policy/is_ratio_max"] == pytest.approx(4.0)
    del mu


def test_kl_to_reference_uses_k3():
    logp = torch.tensor([[-1.0]])
    b = batch([[1]], [[-1.0]], [0.0])
    b.ref_logprobs = torch.tensor([[0.0, -1.5]])
    loss, m = policy_loss(logp, b, LossSettings(variant="dapo", beta=0.1))
    k3 = math.exp(-0.5) - (-0.5) - 1  # exp(ref - logp) - (ref - logp) - 1
    assert loss.item() == pytest.approx(0.1 * k3, rel=1e-5)
    assert m["policy/kl"] == pytest.approx(k3, rel=1e-5)


def test_stale_rows_are_masked_out():
    cfg = LossSettings(variant="dapo", max_staleness=2, current_version=10)
    b = batch(MASK, MU, ADV, versions=[9, 7], num_tokens=3)  # lag 1 (kept) and 3 (too stale)
    loss, m = policy_loss(LOGP, b, cfg)
    assert loss.item() == pytest.approx((L00 + L01) / 3, rel=1e-5)
    assert m["policy/stale_count"] == 1.0


def test_sequence_weights_scale_the_loss():
    loss, _ = policy_loss(LOGP, batch(MASK, MU, ADV, weights=[0.5, 0.0]), LossSettings(variant="dapo"))
    assert loss.item() == pytest.approx(0.5 * (L00 + L01) / 3, rel=1e-5)


def test_masked_positions_get_exactly_zero_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    model = lambda **_: SimpleNamespace(logits=logits)  # noqa: E731  (a fixed "model": its logits are the leaf)
    b = MicroBatch(input_ids=torch.randint(0, 11, (2, 5)), attention_mask=torch.ones(2, 5, dtype=torch.long),
                   loss_mask=torch.tensor([[0, 0, 1, 0, 1], [0, 1, 1, 0, 0.0]]), old_logprobs=torch.full((2, 5), -2.0),
                   advantages=torch.tensor([1.0, -1.0]), policy_version=torch.zeros(2, dtype=torch.long),
                   weights=torch.ones(2), num_sequences=2, num_tokens=4)
    with torch.no_grad():  # behaviour = current policy: ratio 1, nothing clipped, every loss token has a gradient
        b.old_logprobs[:, 1:] = token_logprobs(model, b)[0]
    for variant in ("grpo", "dapo", "dr_grpo"):
        logits.grad = None
        logp, _ = token_logprobs(model, b)
        loss, _ = policy_loss(logp, b, LossSettings(variant=variant))
        loss.backward()
        # logits at t predict token t+1: rows t where loss_mask[t+1] == 0 must get exactly zero gradient
        target_mask = b.loss_mask[:, 1:]
        grads = logits.grad[:, :-1].abs().sum(-1)
        assert torch.all(grads[target_mask == 0] == 0.0)
        assert torch.all(grads[target_mask == 1] > 0.0)
        assert torch.all(logits.grad[:, -1] == 0.0)


def test_micro_batches_sum_to_the_whole_batch_loss():
    whole = batch(MASK, MU, ADV)
    for variant in ("grpo", "dapo", "dr_grpo"):
        cfg = LossSettings(variant=variant)
        total, _ = policy_loss(LOGP, whole, cfg)
        parts = [policy_loss(LOGP[i:i + 1], batch([MASK[i]], [MU[i]], [ADV[i]], num_sequences=2, num_tokens=3), cfg)[0]
                 for i in range(2)]
        assert sum(p.item() for p in parts) == pytest.approx(total.item(), rel=1e-6)
