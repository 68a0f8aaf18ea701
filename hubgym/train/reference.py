"""The reference policy of the KL term (loss.beta > 0): the initial weights, frozen, with no optimizer state.

    reference = Reference(policy)                       # the policy's model folder, before any update
    batch.ref_logprobs = reference.logprobs(batch)      # (B, T) aligned with input_ids, 0 off the loss tokens

It reads the packed micro-batches as they are (the same ids, no re-tokenizing) and computes only
the loss positions, as the policy's loss does (loss.token_logprobs), in the policy's dtype, so at
step 0, where the policy is the reference, the KL is 0.

Under ZeRO-2 it is a plain frozen copy on the policy's device (the weights are small next to the
policy's AdamW state). Under ZeRO-3 it is partitioned like the policy: loaded shard by shard and
wrapped by `deepspeed.initialize` without an optimizer, an inference-only engine whose forward
gathers each layer's weights from every rank; so every rank must call `logprobs` the same number
of times (the packer gives every rank the same number of micro-batches).
"""

from __future__ import annotations

import torch

from hubgym.train.batch import MicroBatch
from hubgym.train.engine import Policy, deepspeed_config, load_model
from hubgym.train.loss import token_aligned, token_logprobs


class Reference:
    def __init__(self, policy: Policy):
        import deepspeed

        config = deepspeed_config(policy.settings)
        model = load_model(policy.model_dir, config)  # the folder the policy started from: its initial weights
        model.requires_grad_(False)
        if policy.settings.zero_stage == 3:
            self.model, *_ = deepspeed.initialize(model=model, config=config)  # no optimizer: no state to hold
        else:
            self.model = model.to(policy.device, policy.dtype)
        self.model.eval()
        self.device = policy.device

    @torch.no_grad()
    def logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """The reference's logprob of each loss token of `batch`, (B, T) aligned with input_ids; 0 elsewhere."""
        logp, _ = token_logprobs(self.model, batch.to(self.device))  # (B, T-1): logits at t predict token t + 1
        return token_aligned(logp)
