"""Run a few GRPO steps of the tiny model on DeepSpeed and save the weights (driven by test_train_deepspeed.py).

    python tests/ds_steps.py MODEL OUT --steps 4 [--zero 2] [--save-at 2] [--resume]
    torchrun --nproc_per_node 2 tests/ds_steps.py MODEL OUT --steps 4

The batches are fixed and synthetic (seeded), so any launcher, process count or interruption
should end with the same weights.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from safetensors.torch import save_file

from hubgym.train.checkpoint import load_checkpoint, save_checkpoint
from hubgym.train.engine import OptimSettings, Policy, shutdown
from hubgym.train.groups import Group
from hubgym.train.loss import LossSettings, make_loss_fn
from hubgym.train.packing import pack_step


def synthetic_groups(step: int, vocab: int = 700) -> list[Group]:
    """Four groups of four rows with varied lengths, rewards and behaviour logprobs."""
    rng = random.Random(step)
    groups = []
    for g in range(4):
        rows, rewards = [], []
        for s in range(4):
            length = rng.randint(3, 12)
            rewards.append(float(rng.random() < 0.5))
            rows.append({"rollout_id": f"{step}-{g}-{s}", "env": "e", "prompt_ids": [rng.randrange(3, vocab) for _ in range(5)],
                         "completion_ids": [rng.randrange(3, vocab) for _ in range(length)],
                         "completion_mask": [int(rng.random() < 0.9) for _ in range(length)],
                         "completion_logprobs": [-rng.uniform(5.0, 8.0) for _ in range(length)],
                         "provenance": {"policy_version": step}})
        mean = sum(rewards) / 4
        groups.append(Group("e", f"{step}-{g}", rows, [r - mean for r in rewards]))
    return groups


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--zero", type=int, default=2)
    parser.add_argument("--save-at", type=int, default=None, help="checkpoint after this many steps and stop")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--nan-at", type=int, default=None, help="make this step's loss NaN")
    parser.add_argument("--micro-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    policy = Policy(args.model, OptimSettings(lr=1e-2, zero_stage=args.zero))
    start = 0
    if args.resume:
        start = load_checkpoint(policy, args.out / "ckpt")["step"] + 1
    for step in range(start, args.steps):
        loss_fn = make_loss_fn(LossSettings(variant="dapo", current_version=step))
        if step == args.nan_at:
            inner = loss_fn
            loss_fn = lambda model, batch: (inner(model, batch)[0] * float("nan"), {})  # noqa: E731
        shares = pack_step(synthetic_groups(step), args.micro_tokens, policy.world_size)
        stats = policy.train_step(shares[policy.rank], loss_fn)
        if policy.rank == 0:
            print(f"step {step} loss {stats.loss:.6f} skipped {stats.skipped} micro {stats.micro_batches}", flush=True)
        if args.save_at is not None and step + 1 == args.save_at:
            save_checkpoint(policy, args.out / "ckpt", step, {"offline_groups": 0})
            break
    state = policy.full_state_dict()
    if policy.rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.clone() for k, v in state.items()}, str(args.out / "weights.safetensors"))
    shutdown()


if __name__ == "__main__":
    main()
