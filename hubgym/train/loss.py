"""The GRPO policy loss, token by token: a clipped policy gradient against the stored behaviour
logprobs, an optional proximal policy with truncated importance sampling (TIS), a k3 KL, and three
ways to aggregate.

    logp, entropy = token_logprobs(model, batch, with_entropy=True)      # (B, T-1), 0 off the loss tokens
    loss, metrics = loss_fn(logp, batch, LossSettings(variant="dapo"), entropy)
    loss, metrics = make_loss_fn(LossSettings())(model, batch)           # what Policy.train_step runs

The loss is a sum of per-token terms (`scale` x l_t below: the weight and the aggregation's divisors
folded into one coefficient per token), so `make_loss_fn` can apply the model's output layer a chunk
of tokens at a time and differentiate each chunk as it goes (hubgym.train.chunked), never holding the
(tokens x vocabulary) logits.

Notation, for a loss token t of sequence i (loss_mask 1):
    logp   the current policy's logprob of the token: the only term with a gradient
    mu     the stored behaviour logprob: what the sampler (vLLM) gave when it drew the token
    prox   the proximal policy: the trainer's own logprob before this update (optional, no gradient)
    A_i    the group-relative advantage;  w_i the sequence weight;  C = is_cap

Without a proximal logprob, the behaviour policy is PPO's "old" policy:
    r     = exp(logp - mu)
    s     = min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)              (clip-higher: eps_high > eps_low)
    s     = max(s, C A)                      if A < 0                   (dual clip: r counts at most C)
    l_it  = -s

With a proximal logprob (`batch.prox_logprobs`, or `proximal="current"`, which takes the current
policy itself, detached: exact for one update per batch and free, no extra forward), PPO clips
against the proximal policy and the sampler/trainer gap is corrected by a truncated IS weight:
    r     = exp(logp - prox)
    rho   = min(exp(prox - mu), C)                                      (no gradient)
    s     = min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    l_it  = -rho s
So in both modes C bounds how much a token's importance weight against the sampler can count.

With beta > 0 and reference logprobs ref:  l_it += beta k3,  k3 = exp(ref - logp) - (ref - logp) - 1
(Schulman's k3 estimator of KL(pi || ref): never negative, low variance).

A sequence marked sft (`batch.sft`: stored rows under offline.loss sft) trains by likelihood instead:
    l_it  = -logp                                                       (no advantage, ratio, clip or KL)
the token-level negative log-likelihood of its sampled tokens, aggregated as every other sequence is below.
Its gradient is the policy gradient of advantage 1 on on-policy tokens: with a reward selection, SFT on stored
rows is rejection-sampling fine-tuning. The policy/ metrics are over the other tokens; sft/tokens and sft/nll
(the mean NLL of its tokens) are its own.

Advantages (groups.py), for the rewards R_1..R_n of one group:
    grpo     A_i = (R_i - mean(R)) / (std(R) + 1e-6)         std: the population std of the group
    dr_grpo  A_i = R_i - mean(R)                               no std: dividing by it up-weights groups whose
                                                               rewards barely differ (Dr. GRPO, section 3.1)
`loss.variant: dr_grpo` implies `grpo.advantage: dr_grpo` (the config sets it; an explicit
`grpo.advantage: grpo` beside it is refused): Dr. GRPO removes both the length and the std normalization.

Aggregation: weighted means. N = sum_i w_i over sequences with a loss token and T = sum_i w_i |o_i|
(|o_i| = loss tokens of i) are counts of the GLOBAL batch (all micro-batches, all ranks:
`batch.num_sequences`, `batch.num_tokens`, made by packing.py):
    grpo     sum_i w_i (sum_t l_it / |o_i|) / N     per-sequence token mean, then mean over sequences
    dapo     sum_it w_i l_it / T                    token mean over the batch (DAPO)
    dr_grpo  sum_it w_i l_it / (N L)                L = dr_grpo_length, a constant (the generation
                                                    budget): no length bias (Dr. GRPO, Liu et al. 2025)
With every w_i = 1 these are plain means. A weight scales a sequence's whole term and its share of
the divisor alike, so a down-weighted zero-variance group (advantage 0) dilutes the others' update
by w_i of a sequence, not by a whole one. Because the divisors are global, the sum of the
micro-batch losses is the whole-batch loss.

Only the loss positions are ever selected, so every other position gets exactly zero gradient,
whatever its stored values.

Metrics, per micro-batch, as 0-dim tensors on the loss's device (Policy.train_step reads a step's
all at once, after the optimizer step); a step merges them over micro-batches and ranks (metrics.merge_metrics):
`tokens` adds up, `_max` is a maximum, and every mean is weighted by its micro-batch's loss tokens, so a
step's value is the mean over all of its loss tokens:
policy/tokens, clip_frac_low (r < 1 - eps_low with A < 0), clip_frac_high (r > 1 + eps_high with
A > 0), clip_frac, is_ratio_mean / is_ratio_max (the weight against the sampler: r without a
proximal policy, exp(prox - mu) with one), is_capped_frac (that weight above C), kl (beta > 0),
entropy (when given). Which rows train at all (staleness, truncation) is decided before packing
(groups.py), not here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from hubgym.train.batch import MicroBatch
from hubgym.train.chunked import OutputHead, chunked_logprobs, fused_token_loss, liger_logprobs, output_head
from hubgym.train.config import ConfigError, validate_options

PROXIMAL = ("batch", "current", "none")


@dataclass(frozen=True)
class LossSettings:
    variant: str = "grpo"  # aggregation: grpo | dapo | dr_grpo
    epsilon_low: float = 0.2  # ratio clipped below at 1 - epsilon_low
    epsilon_high: float = 0.28  # ... and above at 1 + epsilon_high (DAPO's clip-higher)
    beta: float = 0.0  # weight of the k3 KL to the reference (needs batch.ref_logprobs)
    is_cap: float = 2.0  # C: the most a token's importance weight against the sampler counts
    dr_grpo_length: int = 128  # L of dr_grpo: the generation budget in tokens
    proximal: str = "batch"  # batch: batch.prox_logprobs when present | current: the policy itself | none
    output_layer: str = "fused"  # fused: gradients made in the forward (chunked.py) | chunked | liger

    def __post_init__(self) -> None:
        """The ranges are the config's (hubgym.train.config), checked there once: a value a config accepts is
        one the loss accepts. Only `proximal` is not a config option."""
        validate_options("loss", variant=self.variant, epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high,
                         beta=self.beta, is_cap=self.is_cap, output_layer=self.output_layer)
        validate_options("sampling", max_tokens=self.dr_grpo_length)  # L is the generation budget
        if self.proximal not in PROXIMAL:
            raise ConfigError(f"loss proximal is {self.proximal!r}; use one of {', '.join(PROXIMAL)}")


def token_logprobs(model: torch.nn.Module, batch: MicroBatch, with_entropy: bool = False,
                   positions: torch.Tensor | None = None,
                   output_layer: str = "chunked") -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each next token, (B, T-1), at `positions` (default: the loss tokens); 0 elsewhere.

    Also the entropy of the next-token distribution there (no gradient) when asked. A Hugging Face causal LM
    is run up to its last hidden state and its output layer is applied to the selected positions only, a
    chunk at a time (hubgym.train.chunked; `output_layer="liger"`: Liger-Kernel's kernel): the (B, T, V)
    logits are never made. Any other model's logits are taken as it returns them.
    """
    rows, cols = batch.loss_index() if positions is None else positions.nonzero(as_tuple=True)
    if positions is None:
        positions = batch.loss_positions()
    head = output_head(model)
    if head is None:
        logits = model(**batch.model_inputs()).logits  # (B, T, V)
        return gather_logprobs(logits, batch.input_ids, positions, with_entropy)
    targets = batch.input_ids[rows, cols + 1]  # the hidden state at t predicts token t + 1

    logprobs = liger_logprobs if output_layer == "liger" else chunked_logprobs

    def forward() -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = head.hidden_states(**batch.model_inputs())[rows, cols]  # (N, H)
        return head.apply_head(lambda weight: logprobs(hidden, weight, targets, with_entropy=with_entropy), hidden)

    logp, entropy = head.run(forward)
    return _placed(logp, rows, cols, positions.shape), (
        _placed(entropy, rows, cols, positions.shape) if entropy is not None else None)


def gather_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                    with_entropy: bool = False, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next-token logprobs from logits (B, T, V) at the positions (B, T-1) that matter: for a model whose logits
    must be taken whole (token_logprobs uses the output layer directly where it can).

    Only the selected rows of the logits are normalized, in float32 (a (N, V) copy, N = selected
    positions, instead of a full (B, T, V) float32 log_softmax), as gather - logsumexp.
    """
    rows, cols = positions.nonzero(as_tuple=True)
    picked = logits[rows, cols].float()  # (N, V)
    targets = input_ids[rows, cols + 1]  # logits at t predict token t + 1
    target_logits = picked.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N,)
    # The logsumexp after the gather, so its backward runs first: the gather's (N, V) float32 gradient is not yet
    # held while the logsumexp's backward allocates its own (one such tensor less at peak).
    lse = torch.logsumexp(picked, dim=-1)
    out = _placed(target_logits - lse, rows, cols, positions.shape)
    entropy = None
    if with_entropy:
        with torch.no_grad():  # in chunks: the probabilities of a chunk are the only extra (chunk, V) tensor
            lse = lse.detach()
            values = [_entropy(picked[i:i + chunk], lse[i:i + chunk]) for i in range(0, picked.shape[0], chunk)]
            ent = torch.cat(values) if values else picked.new_zeros(0)
            entropy = _placed(ent, rows, cols, positions.shape)
    return out, entropy


def _placed(values: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """(N,) values at (rows, cols) of a zero float32 tensor of `shape` (differentiable)."""
    return torch.zeros(shape, dtype=torch.float32, device=values.device).index_put((rows, cols), values.float())


def token_aligned(next_token_logprobs: torch.Tensor) -> torch.Tensor:
    """(B, T-1) next-token logprobs -> (B, T) aligned with input_ids, as MicroBatch stores them:

        batch.prox_logprobs = token_aligned(policy.logprobs(batch))     # before the update
    """
    return torch.nn.functional.pad(next_token_logprobs, (1, 0))


def _entropy(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """H = lse - sum_v softmax(x)_v x_v, per row, with the logsumexp the loss computed already: one fused softmax
    and one dot product over the logits (on a large vocabulary, each pass over them costs)."""
    return lse - torch.linalg.vecdot(torch.softmax(logits, -1), logits)


# -- the loss as a sum of per-token terms ------------------------------------------------------------

@dataclass
class LossTokens:
    """A micro-batch's loss tokens, (N,) each, in (row, position) order: all that a token's loss term reads.

    `scale` folds the sequence weight and the aggregation's divisors into one coefficient per token, so the
    micro-batch's loss is sum(scale * l): a sum of terms each of which depends on its own token's logprob
    only (what lets hubgym.train.chunked differentiate it chunk by chunk)."""

    rows: torch.Tensor
    cols: torch.Tensor  # (rows, cols): positions in (B, T-1)
    behaviour: torch.Tensor  # mu
    advantage: torch.Tensor
    scale: torch.Tensor
    proximal: torch.Tensor | None  # the stored proximal logprobs, or None
    reference: torch.Tensor | None  # beta > 0
    proximal_is_current: bool  # proximal = the current policy itself, detached
    sft: torch.Tensor | None = None  # (N,) bool: tokens of sequences that train by likelihood; None: none do

    def part(self, part: slice) -> "LossTokens":
        """The tokens in `part` (a chunk)."""
        return replace(self, **{f.name: getattr(self, f.name)[part] for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})


@dataclass
class TokenTerms:
    loss: torch.Tensor  # l_t, (N,), before `scale`
    ratio: torch.Tensor  # no gradient, for the metrics
    is_weight: torch.Tensor
    kl: torch.Tensor | None
    sft: torch.Tensor | None = None  # the tokens' sft flags (LossTokens.sft)
    nll: torch.Tensor | None = None  # -logp of every token (no gradient), for sft/nll


def loss_tokens(batch: MicroBatch, cfg: LossSettings) -> LossTokens:
    """Select the loss tokens of `batch` and the per-token values of their terms (no model output needed)."""
    rows, cols = batch.loss_index()  # the loss tokens: (N,) each
    sequence = batch.sequence_of(rows, cols)  # index into advantages / weights
    reference = None
    if cfg.beta > 0:
        if batch.ref_logprobs is None:
            raise ValueError("loss.beta > 0 needs reference logprobs in the batch (MicroBatch.ref_logprobs)")
        reference = batch.ref_logprobs[:, 1:][rows, cols]
    stored = batch.prox_logprobs is not None and cfg.proximal != "none"
    return LossTokens(rows=rows, cols=cols, behaviour=batch.old_logprobs[:, 1:][rows, cols],
                      advantage=batch.advantages[sequence],
                      scale=batch.weights[sequence] * _divisor_share(batch, cfg, rows, cols, sequence),
                      proximal=batch.prox_logprobs[:, 1:][rows, cols] if stored else None,
                      reference=reference, proximal_is_current=not stored and cfg.proximal == "current",
                      sft=batch.sft[sequence] if batch.sft is not None else None)


def _divisor_share(batch: MicroBatch, cfg: LossSettings, rows, cols, sequence) -> torch.Tensor:
    """1 / the divisor each token's term is summed under (see the aggregation above), (N,)."""
    n = batch.num_sequences or 1  # weighted: may be below 1 (a step of down-weighted groups only)
    if cfg.variant == "grpo":  # |o_i|: the sequence's own loss tokens
        mask = batch.loss_mask[:, 1:][rows, cols]
        lengths = torch.zeros(batch.advantages.shape[0], dtype=mask.dtype, device=mask.device)
        lengths = lengths.index_add(0, sequence, mask).clamp(min=1)
        return 1.0 / (lengths[sequence] * n)
    count = (batch.num_tokens or 1) if cfg.variant == "dapo" else n * cfg.dr_grpo_length
    return torch.full_like(batch.old_logprobs[:, 1:][rows, cols], 1.0 / count)


def token_terms(logp: torch.Tensor, tokens: LossTokens, cfg: LossSettings) -> TokenTerms:
    """l_t for each token from its current logprob (N,): the clipped surrogate, the IS weight and the KL."""
    mu, adv = tokens.behaviour, tokens.advantage
    prox = logp.detach() if tokens.proximal_is_current else tokens.proximal
    if prox is None:
        ratio = torch.exp(logp - mu)
        is_weight = ratio.detach()
    else:
        ratio = torch.exp(logp - prox)
        is_weight = torch.exp(prox - mu)
    clipped = torch.clamp(ratio, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    if prox is None:
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, cfg.is_cap * adv), surrogate)
    else:
        surrogate = torch.clamp(is_weight, max=cfg.is_cap) * surrogate
    per_token = -surrogate  # (N,)
    kl = None
    if tokens.reference is not None:
        delta = tokens.reference - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + cfg.beta * kl
    if tokens.sft is not None:  # likelihood tokens: -logp alone (the other branch's gradient is masked out)
        per_token = torch.where(tokens.sft, -logp, per_token)
    return TokenTerms(per_token, ratio.detach(), is_weight, kl.detach() if kl is not None else None, tokens.sft,
                      -logp.detach() if tokens.sft is not None else None)


def loss_fn(logprobs: torch.Tensor, batch: MicroBatch, cfg: LossSettings,
            entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch, already divided by the global counts, and its metrics (0-dim device tensors:
    hubgym.train.metrics.read_metrics reads a step's all at once).

    `logprobs` is (B, T-1): the current policy's logprob of tokens 1..T-1 (see token_logprobs).
    """
    tokens = loss_tokens(batch, cfg)
    logp = logprobs[tokens.rows, tokens.cols]
    terms = token_terms(logp, tokens, cfg)
    loss = (tokens.scale * terms.loss).sum()  # no loss token: 0, still in the graph (empty selection)
    ent = entropy[tokens.rows, tokens.cols] if entropy is not None else None
    return loss, _metrics(terms, tokens.advantage, ent, cfg)


def fused_loss(head: OutputHead, batch: MicroBatch, cfg: LossSettings,
               with_entropy: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """loss_fn's loss and metrics for a Hugging Face causal LM, from its last hidden state and output weight,
    chunk by chunk, with the gradients made in the forward (hubgym.train.chunked.fused_token_loss)."""
    tokens = loss_tokens(batch, cfg)
    targets = batch.input_ids[tokens.rows, tokens.cols + 1]

    def token_loss(logp: torch.Tensor, part: slice) -> torch.Tensor:
        chunk = tokens.part(part)
        return (chunk.scale * token_terms(logp, chunk, cfg).loss).sum()

    def forward():
        hidden = head.hidden_states(**batch.model_inputs())[tokens.rows, tokens.cols]  # (N, H)
        return head.apply_head(lambda weight: fused_token_loss(hidden, weight, targets, token_loss,
                                                               with_entropy=with_entropy), hidden)

    loss, logp, entropy = head.run(forward)
    with torch.no_grad():
        terms = token_terms(logp, tokens, cfg)
    return loss, _metrics(terms, tokens.advantage, entropy, cfg)


@torch.no_grad()
def _metrics(terms: TokenTerms, adv: torch.Tensor, entropy: torch.Tensor | None,
             cfg: LossSettings) -> dict[str, torch.Tensor]:
    """Fractions and means are over this micro-batch's policy-gradient loss tokens (not its sft ones); `tokens`
    adds up across micro-batches. 0-dim tensors on the loss's device: nothing here waits for the device (tokens
    are counted and averaged under a mask, never selected)."""
    ratio, is_weight = terms.ratio, terms.is_weight
    mine = (~terms.sft if terms.sft is not None else torch.ones_like(ratio, dtype=torch.bool)).float()
    tokens = mine.sum()
    some = tokens > 0

    def mean(values: torch.Tensor, empty: float = 0.0) -> torch.Tensor:
        return torch.where(some, (values.float() * mine).sum() / tokens.clamp(min=1), empty)

    low = ((ratio < 1 - cfg.epsilon_low) & (adv < 0)).float()
    high = ((ratio > 1 + cfg.epsilon_high) & (adv > 0)).float()
    largest = torch.where(mine > 0, is_weight, -torch.inf).max() if ratio.numel() else ratio.new_tensor(-torch.inf)
    values = {
        "policy/tokens": tokens,
        "policy/clip_frac_low": mean(low),
        "policy/clip_frac_high": mean(high),
        "policy/clip_frac": mean(low + high),
        "policy/is_ratio_mean": mean(is_weight, 1.0),
        "policy/is_ratio_max": torch.where(some, largest, 1.0),
        "policy/is_capped_frac": mean(is_weight > cfg.is_cap),
    }
    if terms.kl is not None:
        values["policy/kl"] = mean(terms.kl)
    if entropy is not None:
        values["policy/entropy"] = mean(entropy)
    if terms.sft is not None:
        count = terms.sft.sum().float()
        values["sft/tokens"] = count
        values["sft/nll"] = (terms.nll * terms.sft).sum() / count.clamp(min=1)
    return {key: value.float() for key, value in values.items()}


def make_loss_fn(cfg: LossSettings, with_entropy: bool = True):
    """loss_fn(model, batch) for Policy.train_step: for a Hugging Face causal LM the fused chunked loss
    (`cfg.output_layer` fused), or its logprobs through chunked_logprobs or Liger-Kernel, then loss_fn; the
    logits' loss for any other model."""
    def model_loss(model: torch.nn.Module, batch: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        head = output_head(model) if cfg.output_layer == "fused" else None
        if head is not None:
            return fused_loss(head, batch, cfg, with_entropy)
        logp, entropy = token_logprobs(model, batch, with_entropy, output_layer=cfg.output_layer)
        return loss_fn(logp, batch, cfg, entropy)
    return model_loss
