"""The chunked output layer (hubgym.train.chunked) against the loss on whole logits: the same logprobs, entropy,
loss, metrics and gradients (w.r.t. the hidden states and the output weight, and every weight of a real model
with tied embeddings), chunk boundaries included; and its peak memory is a chunk's, not the whole batch's."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hubgym.train import chunked
from hubgym.train.batch import MicroBatch
from hubgym.train.chunked import chunked_logprobs, fused_token_loss, output_head
from hubgym.train.loss import LossSettings, gather_logprobs, loss_fn, loss_tokens, make_loss_fn, token_terms
from hubgym.train.metrics import read_metrics

from helpers.train_inputs import small_llama

SETTINGS = [  # (variant, proximal, beta): every aggregation, each way of clipping, with and without the KL
    ("grpo", "none", 0.0), ("grpo", "batch", 0.1), ("dapo", "current", 0.05), ("dr_grpo", "none", 0.2),
    ("dapo", "batch", 0.0)]


def random_batch(gen: torch.Generator, vocab: int, rows: int = 3, width: int = 12) -> MicroBatch:
    """Loss tokens scattered over rows of different lengths; behaviour, proximal and reference logprobs far enough
    from the policy's that ratios clip on both sides, the dual clip binds and the IS weight is capped."""
    ids = torch.randint(0, vocab, (rows, width), generator=gen)
    lengths = [width, width - 3, width - 5]
    attention = torch.tensor([[int(t < n) for t in range(width)] for n in lengths[:rows]])
    loss_mask = ((torch.rand(rows, width, generator=gen) < 0.7) & (attention > 0)).float()
    loss_mask[:, :2] = 0.0  # prompts
    noisy = lambda: (-torch.rand(rows, width, generator=gen) * 9) * loss_mask  # noqa: E731
    return MicroBatch(input_ids=ids, attention_mask=attention, loss_mask=loss_mask, old_logprobs=noisy(),
                      advantages=torch.tensor([1.0, -0.7, 0.4][:rows]), weights=torch.tensor([1.0, 0.5, 1.0][:rows]),
                      prox_logprobs=noisy(), ref_logprobs=noisy(), num_sequences=2.5, num_tokens=17.0)


def whole_logits_loss(logits: torch.Tensor, batch: MicroBatch, cfg: LossSettings):
    """The loss as it is computed from the whole (B, T, V) logits (gather_logprobs + loss_fn)."""
    logp, entropy = gather_logprobs(logits, batch.input_ids, batch.loss_positions(), with_entropy=True)
    loss, metrics = loss_fn(logp, batch, cfg, entropy)
    return loss, read_metrics([metrics])[0]


def test_chunked_logprobs_and_their_gradients_equal_a_full_log_softmax():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=gen, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (37,), generator=gen)
    upstream = torch.randn(37, generator=gen)
    logp, entropy = chunked_logprobs(hidden, weight, targets, with_entropy=True, rows=8)  # 5 chunks, the last short
    (logp * upstream).sum().backward()
    got = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    full = torch.log_softmax(hidden @ weight.T, -1)
    expected = full.gather(-1, targets[:, None]).squeeze(-1)
    (expected * upstream).sum().backward()
    assert torch.allclose(logp, expected, atol=1e-5)
    assert torch.allclose(entropy, -(full.exp() * full).sum(-1), atol=1e-5)
    assert torch.allclose(got[0], hidden.grad, atol=1e-5) and torch.allclose(got[1], weight.grad, atol=1e-5)
    assert got[1].abs().sum() > 0


@pytest.mark.parametrize("variant, proximal, beta", SETTINGS)
def test_fused_loss_equals_the_whole_logits_loss_in_value_metrics_and_gradients(variant, proximal, beta):
    gen = torch.Generator().manual_seed(1)
    vocab = 40
    batch = random_batch(gen, vocab)
    cfg = LossSettings(variant=variant, proximal=proximal, beta=beta, dr_grpo_length=8, is_cap=1.5)
    hidden = torch.randn(*batch.input_ids.shape, 8, generator=gen, requires_grad=True)  # (B, T, H)
    weight = (torch.randn(vocab, 8, generator=gen) * 2).requires_grad_()

    expected, expected_metrics = whole_logits_loss(hidden @ weight.T, batch, cfg)
    expected.backward()
    expected_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    tokens = loss_tokens(batch, cfg)
    targets = batch.input_ids[tokens.rows, tokens.cols + 1]

    def token_loss(logp, part):
        chunk = tokens.part(part)
        return (chunk.scale * token_terms(logp, chunk, cfg).loss).sum()

    loss, logp, entropy = fused_token_loss(hidden[tokens.rows, tokens.cols], weight, targets, token_loss,
                                           with_entropy=True, rows=4)  # several chunks
    (loss * 3).backward()  # a scaled loss (DeepSpeed multiplies by the world size) scales the gradients alike
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7) and expected.item() != 0.0
    assert torch.allclose(hidden.grad, 3 * expected_grads[0], atol=1e-5)
    assert torch.allclose(weight.grad, 3 * expected_grads[1], atol=1e-5) and weight.grad.abs().sum() > 0
    with torch.no_grad():
        terms = token_terms(logp, tokens, cfg)
    from hubgym.train.loss import _metrics

    metrics = read_metrics([_metrics(terms, tokens.advantage, entropy, cfg)])[0]
    assert metrics.keys() == expected_metrics.keys()
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert expected_metrics["policy/clip_frac"] > 0 and expected_metrics["policy/is_ratio_max"] > cfg.is_cap


@pytest.fixture(params=["tiny", "llama"])
def causal_lm(request, tiny_model):
    from transformers import AutoModelForCausalLM

    if request.param == "tiny":
        return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    return small_llama()


@pytest.mark.slow
@pytest.mark.parametrize("variant, proximal, beta", SETTINGS[:3])
def test_the_trainers_loss_on_a_tied_causal_lm_equals_the_whole_logits_loss(causal_lm, variant, proximal, beta,
                                                                             monkeypatch):
    model = causal_lm
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    assert output_head(model) is not None
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 5 * model.config.vocab_size)  # 5-row chunks
    monkeypatch.setattr(chunked, "MIN_ROWS", 1)
    assert chunked.chunk_rows(model.config.vocab_size) == 5
    batch = random_batch(torch.Generator().manual_seed(2), model.config.vocab_size, width=40)
    cfg = LossSettings(variant=variant, proximal=proximal, beta=beta, dr_grpo_length=8)

    expected, expected_metrics, expected_grads, loss, metrics = both_losses(model, batch, cfg)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    metrics = read_metrics([metrics])[0]
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, expected_grads[name], atol=1e-5), name
    assert model.get_input_embeddings().weight.grad.abs().sum() > 0


def both_losses(model, batch, cfg):
    """(loss on whole logits, its metrics, its gradients, the trainer's loss, its metrics): the trainer's loss is
    backpropagated, its gradients left on the model."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    expected, expected_metrics = whole_logits_loss(logits, batch, cfg)
    expected.backward()
    expected_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    loss, metrics = make_loss_fn(cfg)(model, batch)
    loss.backward()
    return expected, expected_metrics, expected_grads, loss, metrics


PEAK_SCRIPT = """
import resource, torch
from hubgym.train.chunked import fused_token_loss
N, V, H, ROWS = 4096, 32768, 64, 128
hidden = torch.randn(N, H, requires_grad=True)
weight = torch.randn(V, H, requires_grad=True)
targets = torch.randint(0, V, (N,))
def run(n):
    loss, _, _ = fused_token_loss(hidden[:n], weight, targets[:n], lambda logp, part: -logp.sum(), with_entropy=True,
                                  rows=ROWS)
    loss.backward()
run(ROWS)  # the allocator's and autograd's first-use costs, before the baseline
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run(N)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024 / (N * V * 4))
"""


@pytest.mark.slow
def test_the_fused_loss_never_holds_the_whole_token_by_vocab_logits():
    """One (N, V) float32 tensor is 512 MiB here (the loss on whole logits holds three or more); the fused loss's
    forward and backward stay under a quarter of one: a chunk's few (128, V) tensors and the (V, H) weight gradient."""
    peak = float(subprocess.run([sys.executable, "-c", PEAK_SCRIPT], capture_output=True, text=True,
                                check=True).stdout)
    assert peak < 0.25, f"the fused loss peaked at {peak:.2f} (N, V) float32 tensors"


@pytest.mark.slow
@pytest.mark.parametrize("output_layer", ["chunked", "liger"])
def test_the_other_output_layers_give_the_same_loss_and_gradients(output_layer):
    """loss.output_layer chunked (recomputed in backward) and liger (Liger-Kernel; here its CPU fallback) against
    the loss on whole logits."""
    model = small_llama()
    batch = random_batch(torch.Generator().manual_seed(4), model.config.vocab_size, width=40)
    cfg = LossSettings(variant="grpo", proximal="batch", beta=0.1, output_layer=output_layer)
    expected, expected_metrics, expected_grads, loss, metrics = both_losses(model, batch, cfg)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert read_metrics([metrics])[0]["policy/entropy"] == pytest.approx(expected_metrics["policy/entropy"], rel=1e-5)
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, expected_grads[name], atol=1e-5), name


def test_liger_is_refused_when_missing_with_the_fix(monkeypatch):
    import importlib.util

    from hubgym.train.config import ConfigError, load_config

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "liger_kernel" else real(name, *args))
    with pytest.raises(ConfigError, match=r"loss.output_layer=liger needs Liger-Kernel: pip install 'hubgym\[gpu\]'"):
        load_config(None, ["loss.output_layer=liger"])
