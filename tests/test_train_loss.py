"""The GRPO loss against values worked out by hand from the formulas in hubgym/train/loss.py."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from hubgym.train.batch import MicroBatch
from hubgym.train.config import ConfigError
from hubgym.train.groups import Group, mask_stale
from hubgym.train.loss import LossSettings, token_aligned, token_logprobs
from hubgym.train.loss import loss_fn as device_loss_fn, make_loss_fn as device_make_loss_fn
from hubgym.train.metrics import merge_metrics, read_metrics
from hubgym.train.packing import empty_batch, pack_step


def loss_fn(*args, **kwargs):
    """The loss with its metrics read as numbers, as Policy.train_step reads them after the step."""
    loss, metrics = device_loss_fn(*args, **kwargs)
    return loss, read_metrics([metrics])[0]


def make_loss_fn(*args, **kwargs):
    model_loss = device_make_loss_fn(*args, **kwargs)

    def read(model, batch):
        loss, metrics = model_loss(model, batch)
        return loss, read_metrics([metrics])[0]
    return read


def batch(mask_rows, mu_rows, adv, *, num_sequences=None, num_tokens=None, weights=None, prox=None):
    """A micro-batch whose per-token tensors are given at target positions 1..T-1 (position 0 is the prompt)."""
    b, t = len(mask_rows), len(mask_rows[0]) + 1
    pad = lambda rows: torch.tensor([[0.0] + list(r) for r in rows])  # noqa: E731
    return MicroBatch(
        input_ids=torch.zeros((b, t), dtype=torch.long), attention_mask=torch.ones((b, t), dtype=torch.long),
        loss_mask=pad(mask_rows), old_logprobs=pad(mu_rows), advantages=torch.tensor(adv, dtype=torch.float32),
        weights=torch.tensor(weights or [1.0] * b),
        prox_logprobs=pad(prox) if prox is not None else None,
        num_sequences=num_sequences or b, num_tokens=num_tokens or int(sum(map(sum, mask_rows))))


# Two sequences: 2 and 1 loss tokens, positive and negative advantage, every ratio inside the clip range.
LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -9.0, -9.0]])
MU = [[-1.2, -1.5, 0.0], [-0.1, 0.0, 0.0]]
MASK = [[1, 1, 0], [1, 0, 0]]
ADV = [1.0, -0.5]
R = [math.exp(0.2), math.exp(-0.5), math.exp(-0.2)]  # 1.2214, 0.6065, 0.8187: r = exp(logp - mu)
L00, L01, L10 = -R[0] * 1.0, -R[1] * 1.0, -(R[2] * -0.5)  # l = -A r when nothing clips


@pytest.mark.parametrize("variant, expected", [
    ("grpo", ((L00 + L01) / 2 + L10 / 1) / 2),  # per-sequence mean, then mean over 2 sequences
    ("dapo", (L00 + L01 + L10) / 3),  # token mean over 3 loss tokens
    ("dr_grpo", (L00 + L01 + L10) / (2 * 8)),  # sum / (N * L) with L = 8
])
def test_aggregation_variants(variant, expected):
    loss, metrics = loss_fn(LOGP, batch(MASK, MU, ADV), LossSettings(variant=variant, dr_grpo_length=8))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["policy/clip_frac"] == 0.0 and metrics["policy/tokens"] == 3.0
    assert metrics["policy/is_ratio_mean"] == pytest.approx(sum(R) / 3, rel=1e-5)
    assert metrics["policy/is_ratio_max"] == pytest.approx(R[0], rel=1e-5)


def test_global_counts_divide_not_the_micro_batch_ones():
    # the same micro-batch as 1/4 of a step of 8 sequences and 12 tokens
    loss, _ = loss_fn(LOGP, batch(MASK, MU, ADV, num_sequences=8, num_tokens=12), LossSettings(variant="dapo"))
    assert loss.item() == pytest.approx((L00 + L01 + L10) / 12, rel=1e-5)
    loss, _ = loss_fn(LOGP, batch(MASK, MU, ADV, num_sequences=8, num_tokens=12), LossSettings(variant="grpo"))
    assert loss.item() == pytest.approx(((L00 + L01) / 2 + L10) / 8, rel=1e-5)


def test_clip_high_and_low_and_the_dual_clip_cap():
    cfg = LossSettings(variant="dapo", epsilon_low=0.2, epsilon_high=0.28, is_cap=2.0)
    # A=+1, r=1.5: min(1.5, 1.28) -> loss -1.28 (clipped high)
    loss, m = loss_fn(torch.tensor([[math.log(1.5)]]), batch([[1]], [[0.0]], [1.0]), cfg)
    assert loss.item() == pytest.approx(-1.28) and m["policy/clip_frac_high"] == 1.0 and m["policy/clip_frac_low"] == 0
    # A=+1, r=0.5: min(0.5, 0.8) = 0.5 -> -0.5 (no clip: a low ratio with a positive advantage is not clipped)
    loss, m = loss_fn(torch.tensor([[math.log(0.5)]]), batch([[1]], [[0.0]], [1.0]), cfg)
    assert loss.item() == pytest.approx(-0.5) and m["policy/clip_frac"] == 0.0
    # A=-1, r=0.5: min(-0.5, -0.8) = -0.8 -> loss 0.8 (clipped low)
    loss, m = loss_fn(torch.tensor([[math.log(0.5)]]), batch([[1]], [[0.0]], [-1.0]), cfg)
    assert loss.item() == pytest.approx(0.8) and m["policy/clip_frac_low"] == 1.0
    # A=-1, r=1.2 (inside 1.28): min(-1.2, -1.2) -> 1.2
    loss, _ = loss_fn(torch.tensor([[math.log(1.2)]]), batch([[1]], [[0.0]], [-1.0]), cfg)
    assert loss.item() == pytest.approx(1.2)
    # A=-1, r=4: min(-4, -1.28) = -4, dual clip max(-4, -2) = -2 -> loss 2: the IS weight counts at most C
    loss, m = loss_fn(torch.tensor([[math.log(4.0)]]), batch([[1]], [[0.0]], [-1.0]), cfg)
    assert loss.item() == pytest.approx(2.0) and m["policy/is_ratio_max"] == pytest.approx(4.0)
    assert m["policy/is_capped_frac"] == 1.0


def test_clip_gradients_vanish_outside_the_trust_region():
    cfg = LossSettings(variant="dapo")
    for logr, adv, grad in [(math.log(1.5), 1.0, 0.0), (math.log(0.5), -1.0, 0.0), (math.log(4.0), -1.0, 0.0),
                            (math.log(1.1), 1.0, -1.1), (math.log(0.9), -1.0, 0.9)]:
        logp = torch.tensor([[logr]], requires_grad=True)
        loss_fn(logp, batch([[1]], [[0.0]], [adv]), cfg)[0].backward()
        assert logp.grad.item() == pytest.approx(grad, abs=1e-6)  # d(-A r)/dlogp = -A r inside, 0 when clipped


def test_truncated_importance_weight_with_a_proximal_policy():
    # seq 0 (A=+1): a: r=1.1, rho=min(0.0-log .25 -> 4, 2)=2 -> -2*1.1;  b: r=1.5 -> 1.28, rho=1/0.8=1.25 -> -1.6
    # seq 1 (A=-1): c: r=0.5 -> min(-0.5,-0.8)=-0.8, rho=1 -> 0.8;  d: r=4 -> -4, no dual clip here, rho=1 -> 4
    logp = torch.tensor([[math.log(1.1), math.log(1.5)], [math.log(0.5), math.log(4.0)]])
    mu = [[math.log(0.25), math.log(0.8)], [0.0, 0.0]]
    b = batch([[1, 1], [1, 1]], mu, [1.0, -1.0], prox=[[0.0, 0.0], [0.0, 0.0]])
    loss, m = loss_fn(logp, b, LossSettings(variant="dapo", is_cap=2.0))
    assert loss.item() == pytest.approx((-2.2 - 1.6 + 0.8 + 4.0) / 4, rel=1e-5)
    assert m["policy/is_ratio_max"] == pytest.approx(4.0, rel=1e-5)  # exp(prox - mu), before the cap
    assert m["policy/is_capped_frac"] == 0.25
    assert (m["policy/clip_frac_high"], m["policy/clip_frac_low"]) == (0.25, 0.25)
    # proximal="none" ignores the proximal logprobs: the behaviour policy is the old policy again
    plain, _ = loss_fn(logp, b, LossSettings(variant="dapo", is_cap=2.0, proximal="none"))
    r = [1.1 / 0.25, 1.5 / 0.8]  # 4.4 -> 1.28, 1.875 -> 1.28; c: r=0.5 -> 0.8; d: r=4 -> dual clip 2
    assert plain.item() == pytest.approx((-1.28 - 1.28 + 0.8 + 2.0) / 4, rel=1e-5) and r[0] > 1.28


def test_proximal_current_is_tis_with_one_update_per_batch():
    # ratio = exp(logp - logp.detach()) = 1: the gradient per token is -w rho A / T, rho = min(exp(logp - mu), C)
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    b = batch([[1, 1]], [[-2.0, -1.2]], [0.5], weights=[0.8])
    loss, m = loss_fn(logp, b, LossSettings(variant="dapo", is_cap=2.0, proximal="current"))
    rho = [2.0, math.exp(0.2)]  # exp(1) = 2.718 capped at 2; exp(0.2) = 1.221
    assert loss.item() == pytest.approx(-0.8 * 0.5 * (rho[0] + rho[1]) / 2, rel=1e-5)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.8 * 0.5 * r / 2 for r in rho], rel=1e-5)
    assert m["policy/clip_frac"] == 0.0 and m["policy/is_ratio_max"] == pytest.approx(math.e, rel=1e-5)


def test_kl_to_reference_uses_k3():
    b = batch([[1]], [[-1.0]], [0.0])
    b.ref_logprobs = torch.tensor([[0.0, -1.5]])
    loss, m = loss_fn(torch.tensor([[-1.0]]), b, LossSettings(variant="dapo", beta=0.1))
    k3 = math.exp(-0.5) - (-0.5) - 1  # exp(ref - logp) - (ref - logp) - 1
    assert loss.item() == pytest.approx(0.1 * k3, rel=1e-5)
    assert m["policy/kl"] == pytest.approx(k3, rel=1e-5)
    with pytest.raises(ValueError, match="needs reference logprobs"):
        loss_fn(torch.tensor([[-1.0]]), batch([[1]], [[-1.0]], [0.0]), LossSettings(beta=0.1))


def test_sequence_weights_scale_the_loss():
    loss, _ = loss_fn(LOGP, batch(MASK, MU, ADV, weights=[0.5, 0.0]), LossSettings(variant="dapo"))
    assert loss.item() == pytest.approx(0.5 * (L00 + L01) / 3, rel=1e-5)


def test_a_sequence_weight_scales_its_kl_term_too():
    b = batch([[1]], [[-1.0]], [0.0], weights=[0.25], num_tokens=0.25)  # alone in the step: weighted T = 0.25
    b.ref_logprobs = torch.tensor([[0.0, -1.5]])
    loss, _ = loss_fn(torch.tensor([[-1.0]]), b, LossSettings(variant="dapo", beta=0.1))
    k3 = math.exp(-0.5) - (-0.5) - 1
    assert loss.item() == pytest.approx(0.25 * 0.1 * k3 / 0.25, rel=1e-5)  # a weighted mean of one term: the term


def fixed_model(logits: torch.Tensor):
    """A "model" whose logits are a given leaf tensor, so autograd reports d loss / d logits."""
    return lambda **_: SimpleNamespace(logits=logits)


@pytest.mark.parametrize("variant", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("proximal", ["none", "batch"])
def test_masked_positions_get_exactly_zero_gradient(variant, proximal):
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 11, requires_grad=True)
    model = fixed_model(logits)
    loss_mask = torch.tensor([[0, 0, 1, 0, 1, 1], [0, 1, 1, 0, 0, 0.0], [0, 0, 1, 1, 0, 0]])
    b = MicroBatch(input_ids=torch.randint(0, 11, (3, 6)), attention_mask=torch.ones(3, 6, dtype=torch.long),
                   loss_mask=loss_mask, old_logprobs=torch.full((3, 6), float("nan")),
                   advantages=torch.tensor([1.0, -1.0, 0.5]), weights=torch.ones(3), num_sequences=3, num_tokens=7)
    with torch.no_grad():  # behaviour = current policy on loss tokens, NaN garbage everywhere else
        current = token_logprobs(model, b)[0]
        b.old_logprobs[:, 1:] = torch.where(loss_mask[:, 1:] > 0, current - 0.1, b.old_logprobs[:, 1:])
        b.prox_logprobs = torch.where(loss_mask > 0, 0.0, float("nan"))
        b.prox_logprobs[:, 1:] = torch.where(loss_mask[:, 1:] > 0, current, b.prox_logprobs[:, 1:])
        b.ref_logprobs = b.prox_logprobs.clone()
    cfg = LossSettings(variant=variant, proximal=proximal, beta=0.05)
    logp, entropy = token_logprobs(model, b, with_entropy=True)
    loss, metrics = loss_fn(logp, b, cfg, entropy)
    loss.backward()
    assert torch.isfinite(loss) and all(math.isfinite(v) for v in metrics.values())
    trains = loss_mask[:, 1:] > 0
    grads = logits.grad[:, :-1].abs().sum(-1)  # logits at t predict token t + 1
    assert torch.all(grads[~trains] == 0.0) and torch.all(grads[trains] > 0.0)
    assert torch.all(logits.grad[:, -1] == 0.0)


def test_a_micro_batch_without_loss_tokens_still_backpropagates_zeros():
    # a rank's padding micro-batch must run backward like the others (DeepSpeed collectives), moving nothing
    lm = ToyLM()
    mb = empty_batch(num_sequences=4, num_tokens=10)
    loss, metrics = make_loss_fn(LossSettings(variant="grpo"))(lm, mb)
    loss.backward()
    assert loss.item() == 0.0 and metrics["policy/tokens"] == 0.0 and metrics["policy/clip_frac"] == 0.0
    assert lm.emb.weight.grad is not None and torch.all(lm.emb.weight.grad == 0.0)


def test_token_logprobs_match_a_full_log_softmax():
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 13)
    ids = torch.randint(0, 13, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 1, 1.0]])
    b = MicroBatch(input_ids=ids, attention_mask=torch.ones(2, 5, dtype=torch.long), loss_mask=mask,
                   old_logprobs=torch.zeros(2, 5), advantages=torch.zeros(2), weights=torch.ones(2))
    logp, entropy = token_logprobs(fixed_model(logits), b, with_entropy=True)
    full = torch.log_softmax(logits[:, :-1].double(), -1)
    expected = full.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    on = mask[:, 1:] > 0
    assert torch.allclose(logp[on].double(), expected[on], atol=1e-6) and torch.all(logp[~on] == 0.0)
    expected_entropy = -(full.exp() * full).sum(-1)
    assert torch.allclose(entropy[on].double(), expected_entropy[on], atol=1e-5) and torch.all(entropy[~on] == 0.0)
    half, _ = token_logprobs(fixed_model(logits.bfloat16()), b)  # bf16 logits are normalized in float32
    upcast = torch.log_softmax(logits.bfloat16().float()[:, :-1], -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    assert half.dtype == torch.float32 and torch.allclose(half[on], upcast[on], atol=1e-6)


def test_settings_are_validated():
    with pytest.raises(ConfigError, match="loss.variant: Input should be 'grpo', 'dr_grpo' or 'dapo'"):
        LossSettings(variant="ppo")
    with pytest.raises(ConfigError, match="loss.is_cap=0.5 must be >= 1"):
        LossSettings(is_cap=0.5)


# -- micro-batches and ranks add up to the whole batch ------------------------------------------

class ToyLM(torch.nn.Module):
    """A stand-in causal LM: logits from an embedding of each token, so every token is independent (a packed row
    means nothing to it: its position ids are ignored)."""

    def __init__(self, vocab: int = 16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, vocab)
        torch.nn.init.normal_(self.emb.weight, std=1.0, generator=torch.Generator().manual_seed(0))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return SimpleNamespace(logits=self.emb(input_ids))


def toy_groups() -> list[Group]:
    gen = torch.Generator().manual_seed(2)
    groups = []
    for g in range(4):
        rows = []
        for s in range(3):
            p, c = 2 + g, 1 + (3 * g + 5 * s) % 7
            rows.append({"rollout_id": f"{g}-{s}", "prompt_ids": torch.randint(0, 16, (p,), generator=gen).tolist(),
                         "completion_ids": torch.randint(0, 16, (c,), generator=gen).tolist(),
                         "completion_mask": [int(i % 4 != 2) for i in range(c)],
                         "completion_logprobs": (-torch.rand(c, generator=gen) * 4).tolist(),
                         "provenance": {"policy_version": g}})
        groups.append(Group("e", f"g{g}", rows, [1.0, -0.5, -0.5] if g % 2 else [-1.0, 0.25, 0.75], 1.0 - 0.2 * g,
                            [False, g == 3, False]))
    return groups


@pytest.mark.parametrize("variant", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("proximal", ["none", "current"])
def test_micro_batches_on_all_ranks_sum_to_the_whole_batch(variant, proximal):
    cfg = LossSettings(variant=variant, proximal=proximal, beta=0.0, dr_grpo_length=16)
    groups = toy_groups()

    def total(max_tokens: int, world_size: int) -> tuple[float, torch.Tensor, int]:
        lm = ToyLM()
        shares = pack_step(groups, max_tokens, world_size)
        value = 0.0
        for share in shares:
            for mb in share:
                loss, _ = make_loss_fn(cfg)(lm, mb)
                loss.backward()  # gradients accumulate over micro-batches and "ranks"
                value += loss.item()
        return value, lm.emb.weight.grad.clone(), sum(map(len, shares))

    whole, whole_grad, count = total(10_000, 1)
    assert count == 1
    for max_tokens, world_size in [(24, 1), (24, 2), (16, 3)]:
        value, grad, count = total(max_tokens, world_size)
        assert count >= max(2, world_size)  # really split
        assert value == pytest.approx(whole, rel=1e-5, abs=1e-7)
        assert torch.allclose(grad, whole_grad, atol=1e-6)
    assert whole != 0.0 and whole_grad.abs().sum() > 0


def step_loss(groups: list[Group], variant: str, beta: float = 0.0) -> tuple[float, torch.Tensor]:
    """The whole step's loss and gradient for `groups` on the ToyLM (one micro-batch)."""
    lm = ToyLM()
    [[mb]] = pack_step(groups, 10_000)
    if beta:
        with torch.no_grad():
            mb.ref_logprobs = token_aligned(token_logprobs(lm, mb)[0]) - 0.3  # a reference the policy is not
    loss, _ = make_loss_fn(LossSettings(variant=variant, beta=beta, dr_grpo_length=16))(lm, mb)
    loss.backward()
    return loss.item(), lm.emb.weight.grad.clone()


def with_version(group: Group, key: str, version: int) -> Group:
    rows = [{**row, "rollout_id": f"{key}-{i}", "provenance": {"policy_version": version}}
            for i, row in enumerate(group.rows)]
    return replace(group, key=key, rows=rows, loss_masked=list(group.loss_masked))


@pytest.mark.parametrize("variant", ["grpo", "dapo", "dr_grpo"])
def test_stale_rows_neither_train_nor_dilute_the_fresh_ones(variant):
    toy = toy_groups()
    fresh = [with_version(toy[0], "a", 4), with_version(toy[1], "b", 4)]
    stale = [with_version(toy[0], "a-old", 0), with_version(toy[2], "c-old", 1)]
    assert mask_stale(fresh, version=5, max_staleness=2) == (0, 1)
    assert mask_stale(stale, version=5, max_staleness=2) == (6, 5)  # lags 5 and 4: every row masked
    alone, alone_grad = step_loss(fresh, variant)
    mixed, mixed_grad = step_loss(fresh + stale, variant)
    assert mixed == pytest.approx(alone, rel=1e-6) and alone != 0.0
    assert torch.allclose(mixed_grad, alone_grad, atol=1e-7)
    [[mb]] = pack_step(fresh + stale, 10_000)
    [[only]] = pack_step(fresh, 10_000)
    assert (mb.num_sequences, mb.num_tokens) == (only.num_sequences, only.num_tokens)


@pytest.mark.parametrize("variant, divisor", [("grpo", "sequences"), ("dr_grpo", "sequences"), ("dapo", "tokens")])
def test_a_zero_variance_group_counts_in_the_divisors_by_its_weight(variant, divisor):
    informative = replace(toy_groups()[0], weight=1.0)
    flat_rows = toy_groups()[1].rows

    def flat(weight: float) -> Group:
        return Group("e", "flat", flat_rows, [0.0] * len(flat_rows), weight, [False] * len(flat_rows))

    def size(rows) -> float:  # the group's share of N (sequences) or T (tokens) at weight 1
        return len(rows) if divisor == "sequences" else sum(sum(r["completion_mask"]) for r in rows)

    alone, _ = step_loss([informative], variant)
    for weight in (1.0, 0.1, 0.0):  # keep, downweight, and a weight of 0, which is drop
        loss, _ = step_loss([informative, flat(weight)], variant)
        d = size(informative.rows)
        assert loss == pytest.approx(alone * d / (d + weight * size(flat_rows)), rel=1e-5)
    # with a KL term the flat group's own (advantage-free) term counts by its weight as well
    kl_keep, _ = step_loss([informative, flat(1.0)], variant, beta=0.5)
    kl_down, _ = step_loss([informative, flat(0.1)], variant, beta=0.5)
    assert kl_keep != pytest.approx(kl_down, rel=1e-3)


def test_a_proximal_logprob_from_the_batch_equals_proximal_current():
    lm = ToyLM()
    [[mb]] = pack_step(toy_groups(), 10_000)
    with torch.no_grad():
        mb.prox_logprobs = token_aligned(token_logprobs(lm, mb)[0])
    assert mb.prox_logprobs.shape == mb.input_ids.shape
    results = []
    for proximal in ("batch", "current"):
        lm.zero_grad()
        batch = mb if proximal == "batch" else replace(mb, prox_logprobs=None)
        loss, metrics = make_loss_fn(LossSettings(variant="grpo", proximal=proximal))(lm, batch)
        loss.backward()
        results.append((loss.item(), lm.emb.weight.grad.clone(), metrics["policy/is_ratio_mean"]))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6) and results[0][2] == pytest.approx(results[1][2])
    assert torch.allclose(results[0][1], results[1][1], atol=1e-7)


@pytest.mark.slow
def test_packing_and_loss_on_the_tiny_causal_lm(tiny_model):
    """The real model: right padding changes no logprob, so micro-batch sums equal the whole batch's."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    groups = toy_groups()
    cfg = LossSettings(variant="dapo")

    def run(max_tokens: int) -> tuple[float, torch.Tensor]:
        model.zero_grad()
        value = 0.0
        for mb in pack_step(groups, max_tokens)[0]:
            loss, _ = make_loss_fn(cfg)(model, mb)
            loss.backward()
            value += loss.item()
        return value, model.get_input_embeddings().weight.grad.clone()

    whole, whole_grad = run(10_000)
    split, split_grad = run(16)
    assert split == pytest.approx(whole, rel=1e-5) and whole != 0.0
    assert torch.allclose(split_grad, whole_grad, atol=1e-6)
    [[mb]] = pack_step(groups, 10_000)
    assert mb.position_ids is not None  # several sequences to a row
    with torch.no_grad():
        logp, _ = token_logprobs(model, mb)
    on = mb.loss_mask[:, 1:] > 0
    assert torch.all(logp[~on] == 0.0)
    for i in range(len(mb.rollout_ids)):  # each sequence alone through the model: the same logprobs
        row, cols = mb.span(i)
        ids = mb.input_ids[row:row + 1, cols]
        with torch.no_grad():
            alone = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        trains = on[row, cols.start:cols.stop - 1]
        assert torch.allclose(logp[row, cols.start:cols.stop - 1][trains], alone[trains], atol=1e-5)


# -- a step's policy metrics: token-weighted over micro-batches and ranks -------------------------

def uneven_groups() -> list[Group]:
    """Completions of 1 token beside completions of 40: micro-batches of very different token counts."""
    gen = torch.Generator().manual_seed(5)
    groups = []
    for g, length in enumerate((1, 40, 2, 33)):
        # the short ones were sampled far less likely than the policy has them: large IS ratios
        behaviour = [-8.0] * length if length < 3 else (-torch.rand(length, generator=gen) * 5).tolist()
        rows = [{"rollout_id": f"{g}-{s}", "prompt_ids": torch.randint(0, 16, (3,), generator=gen).tolist(),
                 "completion_ids": torch.randint(0, 16, (length,), generator=gen).tolist(),
                 "completion_mask": [1] * length, "completion_logprobs": behaviour}
                for s in range(2)]
        groups.append(Group("e", f"g{g}", rows, [1.0, -1.0], 1.0, [False, False]))
    return groups


def step_metrics(shares: list[list[MicroBatch]], cfg: LossSettings) -> tuple[dict[str, float], list[dict]]:
    """What Policy.train_step reports on every rank: each rank merges its micro-batches' metrics, and `reduce`
    stands in for the all-reduce (sums and maxima over the ranks' partial values)."""
    lm = ToyLM()
    per_rank = []
    for share in shares:
        metrics = []
        for mb in share:
            with torch.no_grad():
                mb.ref_logprobs = token_aligned(token_logprobs(lm, mb)[0]) * 0.7  # a reference the policy is not
            metrics.append(make_loss_fn(cfg)(lm, mb)[1])
        per_rank.append(metrics)
    partial = []
    for metrics in per_rank:
        merge_metrics(metrics, lambda s, m: (partial.append((s, m)), (s, m))[1])

    def all_reduce(_s, _m):
        return ([sum(v) for v in zip(*(s for s, _ in partial))], [max(v) for v in zip(*(m for _, m in partial))])

    merged = [merge_metrics(metrics, all_reduce) for metrics in per_rank]
    assert all(m == merged[0] for m in merged)  # the same on every rank
    return merged[0], [m for metrics in per_rank for m in metrics]


@pytest.mark.parametrize("max_tokens, world_size", [(64, 1), (64, 2), (48, 3)])
def test_policy_metrics_are_the_token_mean_of_the_whole_step(max_tokens, world_size):
    cfg = LossSettings(variant="grpo", beta=0.1, proximal="none", is_cap=1.5)
    [[whole]] = pack_step(uneven_groups(), 10_000)
    closed = step_metrics([[whole]], cfg)[0]  # one micro-batch: its token means are the closed form
    shares = pack_step(uneven_groups(), max_tokens, world_size)
    merged, parts = step_metrics(shares, cfg)
    tokens = [m["policy/tokens"] for m in parts]
    assert len(parts) >= 3 and max(tokens) >= 5 * min(t for t in tokens if t), tokens  # very uneven
    assert merged.keys() == closed.keys() and "policy/kl" in merged and "policy/entropy" in merged
    for key, value in closed.items():
        assert merged[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    for key in ("policy/is_ratio_mean", "policy/is_capped_frac"):  # a mean of means would be far off
        means = [m[key] for m in parts if m["policy/tokens"]]
        assert sum(means) / len(means) > 1.2 * closed[key], key


PEAK_SCRIPT = """
import resource, sys, torch
from hubgym.train.loss import gather_logprobs
N, V = 1024, 49152
logits = torch.randn(1, N + 1, V, requires_grad=True)
ids, positions = torch.randint(0, V, (1, N + 1)), torch.ones(1, N, dtype=torch.bool)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
logprobs, _ = gather_logprobs(logits, ids, positions, with_entropy=True)
logprobs.sum().backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024 / (N * V * 4))
"""


@pytest.mark.slow
def test_the_loss_backward_holds_at_most_four_float32_token_by_vocab_tensors_at_peak():
    """On a GPU the (loss tokens x vocabulary) float32 tensors of the loss set its peak memory (8 GiB each at 14k
    tokens of a 152k vocabulary): the gather's gradient must not be held while the logsumexp's backward runs."""
    import subprocess
    import sys

    peak = float(subprocess.run([sys.executable, "-c", PEAK_SCRIPT], capture_output=True, text=True,
                                check=True).stdout)
    assert peak < 4.5, f"backward peaked at {peak:.2f} (N, V) float32 tensors above the logits"


@pytest.mark.parametrize("variant, expected", [
    # sequence 0 (grpo) as above; sequence 1 (sft): -logp of its one token, -(-0.3), aggregated alike
    ("grpo", ((L00 + L01) / 2 + 0.3 / 1) / 2),
    ("dapo", (L00 + L01 + 0.3) / 3),
    ("dr_grpo", (L00 + L01 + 0.3) / (2 * 8)),
])
def test_an_sft_sequence_adds_its_negative_log_likelihood_beside_the_policy_gradient(variant, expected):
    mixed = replace(batch(MASK, MU, ADV), sft=torch.tensor([False, True]))
    logp = LOGP.clone().requires_grad_(True)
    loss, metrics = loss_fn(logp, mixed, LossSettings(variant=variant, dr_grpo_length=8))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    # The sft token's gradient is -1 x its share of the divisor, whatever its advantage, ratio or behaviour logprob.
    share = {"grpo": 1 / (1 * 2), "dapo": 1 / 3, "dr_grpo": 1 / (2 * 8)}[variant]
    assert logp.grad[1, 0].item() == pytest.approx(-share, rel=1e-5)
    assert metrics["policy/tokens"] == 2.0 and metrics["sft/tokens"] == 1.0
    assert metrics["sft/nll"] == pytest.approx(0.3, rel=1e-5)
    assert metrics["policy/is_ratio_mean"] == pytest.approx((R[0] + R[1]) / 2, rel=1e-5)  # the grpo tokens only


def test_packed_sft_and_grpo_groups_keep_their_objectives_and_rows_without_logprobs_train():
    def row(i: int, logprobs: list[float]) -> dict:
        return {"rollout_id": f"r{i}", "prompt_ids": [1, 2], "completion_ids": [3, 4], "completion_mask": [1, 1],
                "completion_logprobs": logprobs}
    stored = Group("e", "g1", [row(0, [])], [0.0], objective="sft")  # an imported row: no behaviour logprobs
    fresh = Group("e", "g2", [row(1, [-0.5, -0.5]), row(2, [-0.5, -0.5])], [1.0, -1.0])
    (micro,), = pack_step([stored, fresh], max_tokens=64)
    flags = dict(zip(micro.rollout_ids, micro.sft.tolist()))
    assert flags == {"r0": True, "r1": False, "r2": False}
    assert micro.sequence_index is None or micro.position_ids is None  # one sequence a row here: row i = sequence i
    assert micro.old_logprobs[micro.rollout_ids.index("r0")].abs().sum() == 0  # zeros where nothing was stored
