"""A few optimizer steps of the tiny model on the real DeepSpeed, driven by test_train_deepspeed.py.

    python tests/helpers/ds_steps.py MODEL OUT --steps 3 [--zero 3] [--split 2] [--nan-at 1] [--export DIR]
    torchrun --nproc_per_node 2 tests/helpers/ds_steps.py MODEL OUT --steps 3
    deepspeed --num_gpus 2 tests/helpers/ds_steps.py MODEL OUT --steps 3
    python tests/helpers/ds_steps.py MODEL OUT --steps 3 --save-every 1 --stop-after 2; ... --resume

The data is synthetic and hand-built (no GRPO loss): a fixed pool of 8 rows; each step's global
batch is 4 of them, picked by the torch RNG, weighted by the numpy RNG, with loss tokens masked
by the python RNG, so a resume that failed to restore any RNG ends with other weights. The
global batch is cut into `--split` micro-batches dealt to the ranks in order, so every process
count and accumulation sees the same global batch. The loss is a weighted masked token NLL
divided by the global batch's loss-token count, as hubgym's losses are.

With --beta B the loss is hubgym's GRPO loss instead (dapo aggregation, advantages from the
weights, a k3 KL of weight B against hubgym.train.reference.Reference, the initial weights frozen and,
under ZeRO-3, partitioned across the ranks): the log then holds each step's merged policy metrics,
which are the same for every split and process count.

Rank 0 writes OUT/weights.safetensors and OUT/<--log-file>: per-step stats with a hash of the
weights, AdamW's step count, the NLL of the whole pool before and after (Policy.logprobs) and,
with --reference-norm, what plain transformers gets for step 0's summed-loss gradient norm and for
the NLL before training.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from hubgym.train.batch import MicroBatch
from hubgym.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from hubgym.train.engine import DeepSpeedSettings, Policy, shutdown
from hubgym.train.loss import LossSettings, make_loss_fn
from hubgym.train.ops import shm_buffer_path, uses_shm_buffers
from hubgym.train.reference import Reference

POOL, PER_STEP, PROMPT = 8, 4, 4


def pool_rows() -> list[list[int]]:
    """8 rows over a 16-token alphabet (learnable in a few steps), lengths 10..16, fixed by their own seed."""
    gen = torch.Generator().manual_seed(1234)
    lengths = [10, 16, 12, 14, 11, 15, 13, 16]
    return [torch.randint(10, 26, (n,), generator=gen).tolist() for n in lengths]


def collate(rows: list[list[int]], masks: list[list[float]], weights: list[float], num_tokens: int,
            num_sequences: int) -> MicroBatch:
    """Right-padded micro-batch; the loss mask covers the completion (after PROMPT tokens) where `masks` says."""
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    loss_mask = torch.zeros((len(rows), width))
    for i, (row, mask) in enumerate(zip(rows, masks)):
        ids[i, :len(row)], attention[i, :len(row)] = torch.tensor(row), 1
        loss_mask[i, PROMPT:len(row)] = torch.tensor(mask)
    b = len(rows)
    return MicroBatch(input_ids=ids, attention_mask=attention, loss_mask=loss_mask,
                      old_logprobs=torch.zeros_like(loss_mask), advantages=torch.zeros(b),
                      weights=torch.tensor(weights),
                      num_sequences=num_sequences, num_tokens=num_tokens)


def global_batch(split: int) -> list[MicroBatch]:
    """This step's global batch as `split` micro-batches; draws from the torch, numpy and python RNGs."""
    rows = pool_rows()
    picked = [rows[i] for i in torch.randperm(POOL)[:PER_STEP].tolist()]
    weights = np.random.uniform(0.5, 1.5, PER_STEP).tolist()
    masks = [[float(random.random() < 0.8) for _ in row[PROMPT:]] for row in picked]
    num_tokens = int(sum(map(sum, masks)))
    size = PER_STEP // split
    return [collate(picked[i:i + size], masks[i:i + size], weights[i:i + size], num_tokens, PER_STEP)
            for i in range(0, PER_STEP, size)]


def nll_loss(model, batch: MicroBatch, bad: str | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted masked NLL / global loss tokens. bad='loss': a NaN loss; bad='grad': a finite loss, NaN gradients."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = batch.loss_mask[:, 1:] * batch.weights[:, None]
    loss = -(logp * mask).sum() / batch.num_tokens
    if bad == "loss":
        loss = loss * float("nan")
    elif bad == "grad":  # d sqrt(y)/dy at y = 0 is inf, times dy/dlogits = 0: NaN gradients, loss unchanged
        loss = loss + (logits.sum() * 0.0).sqrt()
    return loss, {"nll_tokens": float(mask.sum())}


def reference_norm(model_dir: str, batches: list[MicroBatch]) -> float:
    """Plain PyTorch: the gradient norm of the sum of every micro-batch's loss (what DeepSpeed must report)."""
    from transformers import AutoModelForCausalLM

    saved = rng_state()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    sum(nll_loss(model, b)[0] for b in batches).backward()
    set_rng_state(saved)
    return torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)).item()


def pool_batch() -> MicroBatch:
    rows = pool_rows()
    return collate(rows, [[1.0] * (len(r) - PROMPT) for r in rows], [1.0] * POOL, 0, POOL)


def pool_nll(logprobs: torch.Tensor) -> float:
    """Mean NLL of the completion tokens of the whole pool, from next-token logprobs (B, T-1)."""
    mask = pool_batch().loss_mask[:, 1:]
    return float(-(logprobs.cpu() * mask).sum() / mask.sum())


def reference_nll(model_dir: str) -> float:
    """The same NLL from the untrained model in plain transformers (checks Policy.logprobs, padding included)."""
    from transformers import AutoModelForCausalLM

    saved = rng_state()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    set_rng_state(saved)
    batch = pool_batch()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    return pool_nll(torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1))


def weights_hash(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode() + state[name].numpy().tobytes())
    return digest.hexdigest()[:16]


def adam_steps(policy: Policy) -> int:
    """AdamW's own step counter (DeepSpeed's ZeRO optimizer wraps the torch one as `.optimizer`)."""
    states = list(policy.engine.optimizer.optimizer.state.values())
    return int(states[0]["step"]) if states else 0


def shm_names() -> list[str]:
    """This group's DeepSpeed allreduce buffers still named in /dev/shm (a killed rank would leave these)."""
    return sorted(p.name for p in shm_buffer_path(0).parent.glob(shm_buffer_path(0).name[:-1] + "*"))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--zero", type=int, default=2)
    parser.add_argument("--split", type=int, default=2, help="micro-batches in the global batch (all ranks)")
    parser.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    parser.add_argument("--nan-at", type=int, default=None, help="this step's loss is NaN")
    parser.add_argument("--bad-grad-at", type=int, default=None, help="this step's gradients are NaN, its loss finite")
    parser.add_argument("--reference-norm", action="store_true")
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--keep", type=int, default=2)
    parser.add_argument("--stop-after", type=int, default=None, help="exit after this many steps (an interruption)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--export", type=Path, default=None)
    parser.add_argument("--log-file", default="log.json")
    parser.add_argument("--beta", type=float, default=None, help="GRPO loss with this KL weight (see above)")
    parser.add_argument("--local_rank", type=int, default=None, help="passed by the deepspeed launcher")
    return parser.parse_args()


def main() -> None:
    args = parse()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    policy = Policy(args.model, DeepSpeedSettings(lr=1e-2, zero_stage=args.zero, gradient_checkpointing=args.grad_ckpt))
    share = args.split // policy.world_size  # micro-batches per rank
    log: dict = {"world_size": policy.world_size, "steps": [], "nll_before": pool_nll(policy.logprobs(pool_batch())),
                 "shm_buffers_used": uses_shm_buffers(policy.world_size), "shm_names_while_running": shm_names()}
    reference = Reference(policy) if args.beta is not None else None
    start = 0
    if args.resume:
        client = load_checkpoint(policy, args.out / "ckpt")
        start, log["resumed"] = client["step"] + 1, {"step": client["step"], "stream": client["stream"]}
    for step in range(start, args.steps):
        batches = global_batch(args.split)
        if args.reference_norm and step == 0 and policy.rank == 0:
            log["reference_norm"] = reference_norm(args.model, batches)
            log["reference_nll"] = reference_nll(args.model)
        bad = "loss" if step == args.nan_at else "grad" if step == args.bad_grad_at else None
        mine = batches[policy.rank * share:(policy.rank + 1) * share]
        loss_fn = lambda model, batch: nll_loss(model, batch, bad)  # noqa: E731
        if reference is not None:
            loss_fn = make_loss_fn(LossSettings(variant="dapo", beta=args.beta, proximal="current"))
            for batch in mine:
                batch.advantages = batch.weights - 1.0  # in [-0.5, 0.5]: some sequences up, some down
                batch.ref_logprobs = reference.logprobs(batch)
        stats = policy.train_step(mine, loss_fn)
        state = policy.full_state_dict()
        log["steps"].append({"step": step, "loss": stats.loss, "grad_norm": stats.grad_norm, "skipped": stats.skipped,
                             "skip_reason": stats.skip_reason, "micro_batches": stats.micro_batches,
                             "tokens": stats.tokens, "lr": stats.lr, "adam_steps": adam_steps(policy),
                             "weights": weights_hash(state) if state else None, "metrics": stats.metrics})
        if args.save_every and (step + 1) % args.save_every == 0:
            save_checkpoint(policy, args.out / "ckpt", step, {"rows_drawn": (step + 1) * PER_STEP}, keep=args.keep)
        if args.stop_after is not None and step + 1 == args.stop_after:
            break
    log["nll_after"] = pool_nll(policy.logprobs(pool_batch()))
    state = policy.full_state_dict()
    if args.export is not None:
        policy.export_hf(args.export)
    if policy.rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        save_file(state, str(args.out / "weights.safetensors"))
        (args.out / args.log_file).write_text(json.dumps(log, indent=1))
    shutdown()


if __name__ == "__main__":
    main()
    # Everything this script reports is on disk. Under load, a two-process run now and then aborts in
    # native teardown at interpreter exit ("terminate called without an active exception"); that is
    # not what these tests measure, so the process ends here, without running that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
