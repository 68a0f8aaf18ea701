"""The reference policy of the KL term (loss.beta > 0): the initial weights, frozen, with no optimizer state.

    reference = Reference(policy)                       # the policy's model folder, before any update
    batch.ref_logprobs = reference.logprobs(batch)      # (B, T) aligned with input_ids, 0 off the loss tokens

It reads the packed micro-batches as they are (the same ids, no re-tokenizing) and computes only
the loss positions, as the policy's loss does (loss.token_logprobs), in the policy's dtype, so at
step 0, where the policy is the reference, the KL is 0.

With LoRA the reference is the policy itself with its adapters disabled (peft's disable_adapter):
the base weights never train, so that is the initial model, at no memory cost.

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
from hubgym.train.lora import adapters_disabled
from hubgym.train.loss import token_aligned, token_logprobs


class Reference:
    def __init__(self, policy: Policy):
        import deepspeed

        self.device, self.policy = policy.device, policy if policy.lora else None
        if self.policy is not None:
            return
        config = deepspeed_config(policy.settings)
        model = load_model(policy.model_dir, config)  # the folder the policy started from: its initial weights
        model.requires_grad_(False)
        if policy.settings.zero_stage == 3:
            self.model, *_ = deepspeed.initialize(model=model, config=config)  # no optimizer: no state to hold
        else:
            self.model = model.to(policy.device, policy.dtype)
        self.model.eval()

    @torch.no_grad()
    def logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """The reference's logprob of each loss token of `batch`, (B, T) aligned with input_ids; 0 elsewhere."""
        if self.policy is not None:
            return self._base_logprobs(batch)
        logp, _ = token_logprobs(self.model, batch.to(self.device))  # (B, T-1): logits at t predict token t + 1
        return token_aligned(logp)

    def _base_logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """The LoRA policy's forward with its adapters off, in eval mode (no adapter dropout either)."""
        engine = self.policy.engine
        was_training = engine.training
        engine.eval()
        try:
            with adapters_disabled(self.policy.module):
                logp, _ = token_logprobs(engine, batch.to(self.device))
        finally:
            engine.train(was_training)
        return token_aligned(logp)
