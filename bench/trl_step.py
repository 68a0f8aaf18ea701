"""TRL's GRPOTrainer taking optimizer steps on a fixed batch of rollouts, for bench/bench_mfu.py's third side.

    stepper = TrlStep(model_dir, rows, n=8, per_micro_batch=4, out=tmp)
    tokens = stepper.step()      # one optimizer step over all rows: TRL's loss, backward, clipping, AdamW

What is TRL's here: the trainer as GRPOConfig builds it (model loading, its accelerator with bf16 autocast on a
GPU, its AdamW and constant schedule) and its loss, `GRPOTrainer.compute_loss` (per-token logprobs and entropies
from the logits of the completion positions, the `grpo` loss with clip 0.2/0.28, no KL), run under its
`compute_loss_context_manager` and backpropagated by its accelerator, then gradient clipping at 1.0 and the
optimizer step. What is not: generation and scoring (the rows are the step's rollouts, already sampled), and
the Trainer's data loader and callbacks (steps are driven here, one at a time, so they can alternate with the
other sides'). Prompts are left-padded and completions right-padded, as TRL's own generation hands them over.
"""

from __future__ import annotations

from pathlib import Path

import torch


def no_reward(completions, **_) -> list[float]:
    """TRL asks for a reward function; nothing here is generated, so nothing is scored."""
    return [0.0] * len(completions)


class TrlStep:
    def __init__(self, model_dir: Path, rows: list[dict], *, n: int, per_micro_batch: int, out: Path,
                 gradient_checkpointing: bool = False, cpu: bool = False):
        import datasets
        from trl import GRPOConfig, GRPOTrainer

        from hubgym.models.tiny import make_tiny_model
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(make_tiny_model(out / "tokenizer"))  # only for TRL's bookkeeping
        config = GRPOConfig(
            output_dir=str(out), per_device_train_batch_size=len(rows), num_generations=n,
            gradient_accumulation_steps=1, max_completion_length=max(len(r["completion_ids"]) for r in rows),
            loss_type="grpo", epsilon=0.2, epsilon_high=0.28, beta=0.0, learning_rate=1e-5,
            lr_scheduler_type="constant", max_grad_norm=1.0, bf16=not cpu and torch.cuda.is_bf16_supported(),
            use_cpu=cpu, gradient_checkpointing=gradient_checkpointing, report_to=[], save_strategy="no",
            disable_tqdm=True)
        prompts = datasets.Dataset.from_list([{"prompt": "x"}] * n)
        self.trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[no_reward], args=config, train_dataset=prompts,
                                   processing_class=tokenizer)
        self.trainer.create_optimizer_and_scheduler(num_training_steps=1 << 20)
        self.batches = [self._inputs(rows[i:i + per_micro_batch], n, tokenizer.pad_token_id)
                        for i in range(0, len(rows), per_micro_batch)]
        self.tokens = sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
        self.trainer.current_gradient_accumulation_steps = len(self.batches)  # what its training loop sets

    def _inputs(self, rows: list[dict], n: int, pad_id: int) -> dict[str, torch.Tensor]:
        """The batch TRL's generation would hand its loss: left-padded prompts, right-padded completions."""
        device = self.trainer.accelerator.device
        prompt_len = max(len(r["prompt_ids"]) for r in rows)
        completion_len = max(len(r["completion_ids"]) for r in rows)
        prompt_ids = torch.full((len(rows), prompt_len), pad_id, dtype=torch.long)
        prompt_mask = torch.zeros_like(prompt_ids)
        completion_ids = torch.full((len(rows), completion_len), pad_id, dtype=torch.long)
        completion_mask = torch.zeros_like(completion_ids)
        for i, r in enumerate(rows):
            p, c = len(r["prompt_ids"]), len(r["completion_ids"])
            prompt_ids[i, prompt_len - p:], prompt_mask[i, prompt_len - p:] = torch.tensor(r["prompt_ids"]), 1
            completion_ids[i, :c], completion_mask[i, :c] = torch.tensor(r["completion_ids"]), 1
        rewards = torch.tensor([float(r["reward"]) for r in rows])
        advantages = rewards - rewards.mean()  # any values: the step's cost does not depend on them
        inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                  "completion_mask": completion_mask, "advantages": advantages,
                  "num_items_in_batch": completion_mask.sum().float()}
        return {k: v.to(device) for k, v in inputs.items()}

    def step(self) -> int:
        """One optimizer step over every micro-batch; the tokens it trained on (prompt + completion)."""
        trainer = self.trainer
        model = trainer.model
        model.train()
        for inputs in self.batches:
            with trainer.compute_loss_context_manager():
                loss = trainer.compute_loss(model, inputs)
            trainer.accelerator.backward(loss)  # divided by the accumulation steps in compute_loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return self.tokens
