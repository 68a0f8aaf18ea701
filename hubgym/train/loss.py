"""The GRPO policy loss, token by token, with three ways to aggregate.

For a completion token t of sequence i (loss_mask 1), with A_i the group-relative advantage,
w_i the sequence weight, logp the current policy's logprob and mu the stored behaviour logprob:

    r      = exp(logp - mu)                                  importance ratio vs the sampler
    s      = min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)   PPO clipped surrogate (clip-higher)
    s      = max(s, is_cap * A)            where A < 0           dual clip: the ratio's weight is capped
    l_it   = -w_i * s + beta * k3(logp, ref)                     k3 = exp(ref - logp) - (ref - logp) - 1

The stored behaviour logprobs are the "old" policy, so stale and offline rows are corrected by
their ratio; the ratio's influence is bounded by the clip (A > 0) and by `is_cap` (A < 0), a
truncated importance weight. Rows older than `max_staleness` policy versions get no gradient.

Aggregation (N = sequences and T = loss tokens of the GLOBAL batch, L = a constant length):
    grpo     sum_i (sum_t l_it / |o_i|) / N     per-sequence mean, then mean over sequences
    dapo     sum_it l_it / T                    token mean over the batch
    dr_grpo  sum_it l_it / (N * L)              no length normalization (Dr. GRPO)
Dividing by global counts makes the sum over micro-batches and ranks equal the whole-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hubgym.train.batch import MicroBatch


@dataclass(frozen=True)
class LossSettings:
    variant: str = "grpo"  # grpo | dapo | dr_grpo
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    beta: float = 0.0
    is_cap: float = 2.0
    max_staleness: int | None = None
    dr_grpo_length: int = 128  # L: the generation budget (Dr. GRPO's constant)
    current_version: int = 0  # the policy version being trained (for staleness)


def token_logprobs(model: torch.nn.Module, batch: MicroBatch,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logprob of each next token [B, T-1] (and the entropy of each next-token distribution)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits[:, :-1]
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logprobs.exp() * logprobs).sum(-1)
    return chosen, entropy


def policy_loss(logp: torch.Tensor, batch: MicroBatch, cfg: LossSettings,
                entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch (already divided by the global counts) and its metrics.

    `logp` is [B, T-1]: logprobs of tokens 1..T-1 under the current policy (see token_logprobs).
    """
    mask = batch.loss_mask[:, 1:].float() * stale_keep(batch, cfg).unsqueeze(1)
    mu = batch.old_logprobs[:, 1:]
    adv = batch.advantages.unsqueeze(1)
    log_ratio = torch.where(mask > 0, logp - mu, torch.zeros_like(logp))  # never exp() a padding position
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    surrogate = torch.where(adv < 0, torch.maximum(surrogate, cfg.is_cap * adv), surrogate)
    per_token = -surrogate * batch.weights.unsqueeze(1)
    kl = None
    if cfg.beta > 0:
        if batch.ref_logprobs is None:
            raise ValueError("loss.beta > 0 needs reference logprobs in the batch (ref_logprobs)")
        delta = torch.where(mask > 0, batch.ref_logprobs[:, 1:] - logp, torch.zeros_like(logp))
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + cfg.beta * kl
    per_token = per_token * mask  # masked positions: exactly zero, so exactly zero gradient
    loss = aggregate(per_token, mask, batch, cfg)
    return loss, _metrics(ratio, adv, mask, cfg, kl, entropy, batch)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, batch: MicroBatch, cfg: LossSettings) -> torch.Tensor:
    n = max(batch.num_sequences, 1)
    if cfg.variant == "grpo":
        lengths = batch.loss_mask[:, 1:].sum(1).clamp(min=1)  # |o_i| counts the sequence's own loss tokens
        return (per_token.sum(1) / lengths).sum() / n
    if cfg.variant == "dapo":
        return per_token.sum() / max(batch.num_tokens, 1)
    if cfg.variant == "dr_grpo":
        return per_token.sum() / (n * cfg.dr_grpo_length)
    raise ValueError(f"loss variant is {cfg.variant!r}; use grpo, dapo or dr_grpo")


def stale_keep(batch: MicroBatch, cfg: LossSettings) -> torch.Tensor:
    """1.0 for rows within the staleness bound, 0.0 for older ones."""
    if cfg.max_staleness is None:
        return torch.ones_like(batch.advantages)
    lag = cfg.current_version - batch.policy_version
    return (lag <= cfg.max_staleness).to(batch.advantages.dtype)


@torch.no_grad()
def _metrics(ratio, adv, mask, cfg: LossSettings, kl, entropy, batch: MicroBatch) -> dict[str, float]:
    tokens = mask.sum().clamp(min=1)
    low = ((ratio < 1 - cfg.epsilon_low) & (adv < 0) & (mask > 0)).sum() / tokens
    high = ((ratio > 1 + cfg.epsilon_high) & (adv > 0) & (mask > 0)).sum() / tokens
    masked_ratio = ratio[mask > 0]
    metrics = {
        "policy/clip_frac_low": float(low), "policy/clip_frac_high": float(high),
        "policy/clip_frac": float(low + high),
        "policy/is_ratio_mean": float(masked_ratio.mean()) if masked_ratio.numel() else 1.0,
        "policy/is_ratio_max": float(masked_ratio.max()) if masked_ratio.numel() else 1.0,
        "policy/stale_count": float((stale_keep(batch, cfg) == 0).sum()),
        "policy/staleness_max": float((cfg.current_version - batch.policy_version).max()),
    }
    if kl is not None:
        metrics["policy/kl"] = float((kl * mask).sum() / tokens)
    if entropy is not None:
        metrics["policy/entropy"] = float((entropy * mask).sum() / tokens)
    return metrics


def make_loss_fn(cfg: LossSettings, with_entropy: bool = True):
    """loss_fn(model, batch) for Policy.train_step."""
    def loss_fn(model: torch.nn.Module, batch: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp, entropy = token_logprobs(model, batch, with_entropy)
        return policy_loss(logp, batch, cfg, entropy)
    return loss_fn
