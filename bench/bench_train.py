"""Benchmark a hubgym GRPO training step against a bare DeepSpeed loop on the same packed batches.

    python bench/bench_train.py                 # updates bench/RESULTS.md
    python bench/bench_train.py --steps 6 --no-write
    python bench/bench_train.py --model smollm2-135m   # SmolLM2-135M-Instruct, its own section (~10 min)

Both sides train the same model (one process, ZeRO-2, fp32, torch AdamW) in this process: the tiny
local model by default, 8 groups x 8 samples of 48 + 64-128 tokens; or with `--model smollm2-135m`
SmolLM2-135M-Instruct (hubgym.models.resolve_model) on batches shaped like its arithmetic:sums
rollouts: 2 groups x 8 samples, a 45-token prompt (its chat template with its default system
prompt) and 24-48 completion tokens, about 80 tokens a sequence, 3 measured steps per side.

- hubgym: a step as the trainer runs it: rollout rows streamed from an Arrow shard on disk
  (hubgym.hub.rollouts), grouped with advantages (GroupStream), packed (pack_step), the GRPO loss
  with its metrics (make_loss_fn), Policy.train_step, and the per-env metrics of the step's rows.
- bare: the micro-batches that packing produced, precomputed, then for each one forward,
  a masked policy-gradient loss, engine.backward, and one engine.step per step: nothing else.

Steps alternate (bare, hubgym, hubgym, bare, ...) after a warm-up of each, and tokens/s counts the
real (non-pad) tokens forwarded. The ratio is hubgym's tokens/s over the bare loop's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

from results import write_section  # noqa: E402  (bench/ is on sys.path when run as a script)
HEADING = "## Training step: hubgym vs a bare DeepSpeed loop"
REAL_HEADING = "## Training step: hubgym vs a bare DeepSpeed loop, SmolLM2-135M-Instruct"
SHAPES = {  # --model: default --groups, --prompt, --completion, --steps, and how results name it
    "tiny": dict(groups=8, prompt=48, completion=128, steps=10, label="tiny model"),
    "smollm2-135m": dict(groups=2, prompt=45, completion=48, steps=3,
                         label="SmolLM2-135M-Instruct (134.5M parameters)"),
}


def make_rows(groups: int, n: int, prompt: int, completion: int, seed: int = 0) -> list[dict]:
    """Rollout rows with random tokens (the model does not care), rewards 0/1 per sample."""
    from helpers.stream_rows import row  # the test suite's complete, schema-valid rollout row

    rng = random.Random(seed)
    rows = []
    for g in range(groups):
        for s in range(n):
            length = rng.randint(completion // 2, completion)
            rows.append(row("arithmetic", g, s, float(rng.random() < 0.5), n_prompt=prompt, n_completion=length,
                            prompt_ids=[rng.randrange(3, 700) for _ in range(prompt)],
                            completion_ids=[rng.randrange(3, 700) for _ in range(length)],
                            completion_logprobs=[-6.5] * length))
    return rows


def hubgym_step(policy, shard_dir: Path, settings, loss_fn, budget: int) -> tuple[int, float]:
    from hubgym.hub.rollouts import iter_rollouts
    from hubgym.train.evaluate import env_metrics
    from hubgym.train.stream import GroupStream
    from hubgym.train.packing import pack_step

    started = time.perf_counter()
    groups = list(GroupStream([iter_rollouts([shard_dir])], settings))
    [batches] = pack_step(groups, budget)
    stats = policy.train_step(batches, loss_fn)
    env_metrics([r for g in groups for r in g.rows])
    return stats.tokens, time.perf_counter() - started


def bare_step(engine, batches) -> tuple[int, float]:
    """Forward (whole logits), a masked policy-gradient loss, backward; one optimizer step. A row of several
    sequences (none in this benchmark's batches) gets its position ids, so attention stays within each."""
    started = time.perf_counter()
    tokens = 0
    for i, mb in enumerate(batches):
        packed = mb.position_ids is not None
        inputs = mb.model_inputs() if packed else {"input_ids": mb.input_ids, "attention_mask": mb.attention_mask}
        logits = engine(**inputs, use_cache=False).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)
        mask = mb.loss_mask[:, 1:]
        advantages = mb.advantages[mb.sequence_index[:, 1:]] if packed else mb.advantages[:, None]
        loss = -(logp * mask * advantages).sum() / mb.num_tokens
        engine.set_gradient_accumulation_boundary(i == len(batches) - 1)
        engine.backward(loss, scale_wrt_gas=False)
        tokens += mb.attention_mask.sum()  # read after the step: no wait for the device in the loop
    engine.step()
    return int(tokens), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", choices=sorted(SHAPES), help="the model both sides train")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per side (tiny 10, smollm2-135m 3)")
    parser.add_argument("--groups", type=int, default=None, help="groups per step (tiny 8, smollm2-135m 2)")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (tiny 48, smollm2-135m 45)")
    parser.add_argument("--completion", type=int, default=None,
                        help="longest completion; each is half that to that (tiny 128, smollm2-135m 48)")
    parser.add_argument("--budget", type=int, default=4096, help="tokens per micro-batch")
    parser.add_argument("--compile", action="store_true", help="hubgym's side with optim.compile (torch.compile)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    for key, value in SHAPES[args.model].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)

    import deepspeed
    from rich.console import Console
    from rich.table import Table
    from transformers import AutoModelForCausalLM

    from hubgym.models import resolve_model
    from hubgym.rollout.writer import ShardWriter
    from hubgym.train.engine import DeepSpeedSettings, Policy
    from hubgym.train.groups import GroupSettings
    from hubgym.train.stream import GroupStream
    from hubgym.train.loss import LossSettings, make_loss_fn
    from hubgym.train.packing import pack_step

    console = Console(width=140)
    load = os.getloadavg()
    model_dir = resolve_model(args.model)
    rows = make_rows(args.groups, args.n, args.prompt, args.completion)
    settings = GroupSettings(n=args.n)
    with tempfile.TemporaryDirectory() as tmp:
        writer = ShardWriter(tmp, "w000of001", max_rows=len(rows))
        writer.add_group(rows)
        writer.flush()
        policy = Policy(model_dir, DeepSpeedSettings(lr=1e-4, compile=args.compile))
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        bare, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), config={
            "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": 2}, "steps_per_print": 1 << 30})
        [batches] = pack_step(list(GroupStream([rows], settings)), args.budget)
        loss_fn = make_loss_fn(LossSettings(variant="grpo"))
        hub_step = lambda: hubgym_step(policy, Path(tmp), settings, loss_fn, args.budget)  # noqa: E731
        bare_run = lambda: bare_step(bare, batches)  # noqa: E731
        hub_step(), bare_run()  # warm-up (and, with --compile, the compilation)
        times: dict[str, list[tuple[int, float]]] = {"bare": [], "hubgym": []}
        order = ["bare", "hubgym", "hubgym", "bare"]
        for i in range(2 * args.steps):
            side = order[i % 4]
            times[side].append(bare_run() if side == "bare" else hub_step())
    rate = {side: statistics.median(t / s for t, s in runs) for side, runs in times.items()}
    step_s = {side: statistics.median(s for _, s in runs) for side, runs in times.items()}
    tokens = times["bare"][0][0]
    table = Table("side", "tokens/step", "median step (s)", "median tokens/s", "ratio vs bare",
                  title="training step: hubgym vs bare DeepSpeed")
    for side in ("bare", "hubgym"):
        table.add_row(side, f"{tokens:,}", f"{step_s[side]:.3f}", f"{rate[side]:,.0f}",
                      f"{rate[side] / rate['bare']:.3f}")
    console.print(table, f"load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    if not args.no_write:
        write_results(args, table, rate["hubgym"] / rate["bare"], (load[0], os.getloadavg()[0]), len(batches))


def write_results(args, table, ratio: float, load: tuple[float, float], micro_batches: int) -> None:
    from rich.console import Console

    capture = Console(width=140, record=True, file=open(os.devnull, "w"))
    capture.print(table)
    command = "python bench/bench_train.py" + (f" --model {args.model}" if args.model != "tiny" else "")
    body = (f"Measured {dt.date.today()} with `{command}` on {platform.machine()} ({os.cpu_count()} cores), "
            f"load average {load[0]:.2f} at start, {load[1]:.2f} at the end. One step = {args.groups} groups x "
            f"{args.n} samples, prompts {args.prompt} tokens, completions {args.completion // 2}-{args.completion} "
            f"tokens, {micro_batches} micro-batches of at most {args.budget} tokens; {args.label}, ZeRO-2, fp32, "
            f"{args.steps} measured steps per side, alternating.\n\n```\n{capture.export_text()}```\n\n"
            f"hubgym / bare = **{ratio:.3f}** (target at least 0.9). hubgym's step includes reading the rows "
            f"from an Arrow shard, grouping, advantages, packing, the full GRPO loss (clipping, metrics, entropy) "
            f"and the per-env metrics; the bare loop only does forward, a masked policy-gradient loss, backward "
            f"and the optimizer step on the already packed micro-batches.\n")
    write_section(HEADING if args.model == "tiny" else REAL_HEADING, body)


if __name__ == "__main__":
    main()
