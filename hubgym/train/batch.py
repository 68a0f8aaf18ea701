"""The packed micro-batch: the one tensor contract between the shard stream, the losses and DeepSpeed.

Rows are laid out left-aligned and right-padded, prompt then completion, exactly as stored in the
shards (never re-tokenized). Every per-token tensor is aligned with `input_ids`: position t holds
what belongs to token t. A causal LM's logits at t-1 predict token t, so the losses compare
`logits[:, :-1]` with `input_ids[:, 1:]` and read every per-token tensor at `[:, 1:]`.

    input_ids        [B, T] int64   prompt ids + completion ids, 0-padded
    attention_mask   [B, T] int64   1 on real tokens
    loss_mask        [B, T] float32 1 on model-sampled completion tokens that train; 0 on prompt,
                                    tool/env tokens, padding, and (if so configured) truncated rows
    old_logprobs     [B, T] float32 behaviour logprobs from the engine (0 where loss_mask is 0)
    advantages       [B]    float32 one group-relative advantage per sequence
    weights          [B]    float32 per-sequence weight (zero-variance down-weighting; 1 otherwise)
    ref_logprobs     [B, T] float32 optional, reference-model logprobs when beta > 0
    prox_logprobs    [B, T] float32 optional, the trainer's own logprobs before this update (the
                                    "proximal" policy): when present the loss clips against them and
                                    corrects the sampler mismatch with a truncated IS weight (loss.py)

`num_sequences` (sequences with at least one loss token) and `num_tokens` (loss tokens), each
sequence counted by its weight, are the counts of the *global* batch (all micro-batches of one
optimizer step, on all ranks): losses divide by them, so summing the per-micro-batch losses gives
the same objective whatever the accumulation or the number of processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch


@dataclass
class MicroBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    prox_logprobs: torch.Tensor | None = None
    num_sequences: float = 0  # of the global batch, weighted (set when the step's micro-batches are known)
    num_tokens: float = 0  # loss-mask tokens of the global batch, weighted by their sequence's weight
    rollout_ids: list[str] = field(default_factory=list)  # for logs and checks, never for the loss
    envs: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Real (non-pad) tokens in this micro-batch: what throughput counts."""
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> "MicroBatch":
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **moved)
