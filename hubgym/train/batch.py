"""The packed micro-batch: the one tensor contract between the shard stream, the losses and DeepSpeed.

Each sequence is laid out prompt then completion, exactly as stored in the shards (never
re-tokenized). A row holds one sequence or several back to back (packing.py), and is right-padded
to the micro-batch's width. Every per-token tensor is aligned with `input_ids`: position t holds
what belongs to token t. A causal LM's logits at t-1 predict token t, so the losses compare
`logits[:, :-1]` with `input_ids[:, 1:]` and read every per-token tensor at `[:, 1:]`.

A row of several sequences carries `position_ids` that restart at 0 with each sequence; the model
then keeps attention within each (transformers reads packed sequences from the position ids: a
block-diagonal causal mask under SDPA, flash-attention's varlen kernel where it is the attention).
Right padding continues the positions of the row's last sequence, so a row of one sequence is an
ordinary causal row that needs no mask at all (no real token attends to the padding after it).

    input_ids        [B, T] int64   prompt ids + completion ids, 0-padded
    attention_mask   [B, T] int64   1 on real tokens
    loss_mask        [B, T] float32 1 on model-sampled completion tokens that train; 0 on prompt,
                                    tool/env tokens, padding, and (if so configured) truncated rows
    old_logprobs     [B, T] float32 behaviour logprobs from the engine (0 where loss_mask is 0)
    advantages       [S]    float32 one group-relative advantage per sequence (S sequences; S = B unpacked)
    weights          [S]    float32 per-sequence weight (zero-variance down-weighting; 1 otherwise)
    sft              [S]    bool    optional, sequences that train by likelihood (offline.loss sft: the loss
                                    is -logp of each loss token, no advantage or ratio); absent: none
    ref_logprobs     [B, T] float32 optional, reference-model logprobs when beta > 0
    prox_logprobs    [B, T] float32 optional, the trainer's own logprobs before this update (the
                                    "proximal" policy): when present the loss clips against them and
                                    corrects the sampler mismatch with a truncated IS weight (loss.py)
    position_ids     [B, T] int64   optional, set when a row holds several sequences: each restarts at 0
    sequence_index   [B, T] int64   optional, which sequence (index into advantages/weights) each token
                                    belongs to; absent: row i is sequence i
The per-sequence tensors (`advantages`, `weights`, `rollout_ids`, `envs`) have one entry per sequence.
A sequence's first token is never a loss token (it is a prompt token), so no logit trains across a
boundary between two sequences of a row.

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
    sft: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    prox_logprobs: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    sequence_index: torch.Tensor | None = None
    loss_rows: torch.Tensor | None = None  # the loss positions' (row, column) in (B, T-1), found on the host
    loss_cols: torch.Tensor | None = None  # when packed: on a GPU, nonzero() would wait for the device
    num_sequences: float = 0  # of the global batch, weighted (set when the step's micro-batches are known)
    num_tokens: float = 0  # loss-mask tokens of the global batch, weighted by their sequence's weight
    rollout_ids: list[str] = field(default_factory=list)  # for logs and checks, never for the loss
    envs: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Real (non-pad) tokens in this micro-batch: what throughput counts."""
        return int(self.attention_mask.sum())

    def loss_positions(self) -> torch.Tensor:
        """(B, T-1) bool: where the logits at t predict a loss token t + 1."""
        return self.loss_mask[:, 1:] > 0

    def loss_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, cols), (N,) each: where loss_positions() is True, in row-major order."""
        if self.loss_rows is not None and self.loss_cols is not None:
            return self.loss_rows, self.loss_cols
        return self.loss_positions().nonzero(as_tuple=True)

    def with_loss_index(self) -> "MicroBatch":
        """This batch with its loss index found now (on the host, before it moves to a device)."""
        rows, cols = self.loss_positions().nonzero(as_tuple=True)
        return replace(self, loss_rows=rows, loss_cols=cols)

    def next_token_positions(self) -> torch.Tensor:
        """(B, T-1) bool: where the next token is a real token of the same sequence (every logprob that means
        something: not the padding, not the first token of the next sequence of a packed row)."""
        positions = self.attention_mask[:, 1:] > 0
        if self.sequence_index is not None:
            positions = positions & (self.sequence_index[:, 1:] == self.sequence_index[:, :-1])
        return positions

    def sequence_of(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The sequence (index into advantages/weights) of the tokens at (rows, cols + 1)."""
        return self.sequence_index[:, 1:][rows, cols] if self.sequence_index is not None else rows

    def span(self, sequence: int) -> tuple[int, slice]:
        """(row, columns) of sequence `sequence`'s tokens: where to read its ids, masks and logprobs."""
        if self.sequence_index is None:
            return sequence, slice(0, int(self.attention_mask[sequence].sum()))
        rows, cols = ((self.sequence_index == sequence) & (self.attention_mask > 0)).nonzero(as_tuple=True)
        return int(rows[0]), slice(int(cols.min()), int(cols.max()) + 1)

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """What the model's forward takes: the ids, and the position ids of a packed micro-batch. No attention
        mask: padding is only ever at a row's end, after every real token (see above)."""
        if self.position_ids is None:
            return {"input_ids": self.input_ids}
        return {"input_ids": self.input_ids, "position_ids": self.position_ids}

    def to(self, device: torch.device | str) -> "MicroBatch":
        """On `device`; to a GPU from pinned memory, so the copies queue behind the GPU's work without waiting."""
        pin = torch.device(device).type == "cuda"
        moved = {f.name: (t.pin_memory() if pin and t.device.type == "cpu" else t).to(device, non_blocking=pin)
                 for f in fields(self) if isinstance(t := getattr(self, f.name), torch.Tensor)}
        return replace(self, **moved)
