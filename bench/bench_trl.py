"""Benchmark a hubgym online GRPO step against TRL's GRPOTrainer on the same model, batch shape and loss.

    pip install trl                                # not a hubgym dependency
    python bench/bench_trl.py                      # tiny and small model; updates bench/RESULTS.md
    python bench/bench_trl.py --models tiny --steps 6 --no-write

Both sides run GRPO on the arithmetic env (`arithmetic:tiny` tasks, its verifier as the reward)
from the same locally made model, with the same step: `--groups` prompts x `--n` samples,
at most `--max-tokens` new tokens, temperature 1, the same loss type (`grpo`, `dapo` or `dr_grpo`),
clip range 0.2/0.28, no KL term, AdamW at the same learning rate, fp32, one process on the CPU.
Each side runs in its own child process (one after the other, order rotating per model), so
neither's threads or allocator disturb the other; the first `--warmup` steps are not counted.

- hubgym: `hubgym.train.Trainer`, online phase only: vLLM samples each group, the new weights are
  synced into vLLM every step, DeepSpeed ZeRO-2 trains. Strictly on-policy, like TRL.
- hubgym-async: the same with `online.async_steps=1`: step t's rollouts are sampled (by the weights of
  step t-1) while step t-1 trains, so sampling and training overlap; one step off-policy, corrected by
  the loss's importance weight. TRL's GRPOTrainer has no such mode on the CPU.
- TRL: `GRPOTrainer` with its default generation (`model.generate` in the training process) and its
  torch AdamW, no DeepSpeed. TRL's vLLM modes do not run here: `server` needs a GPU server, and
  `colocate` starts vLLM on the CPU but fails at its first weight sync (its per-parameter
  `load_weights` meets parameters that vLLM's CPU kernels have repacked: no `weight_loader`).

Reported per side: seconds per step, the part of it spent waiting for sampling and scoring (hubgym:
vLLM generation plus weight sync; hubgym-async: the wait for rollouts sampled in the background; TRL:
`_generate_and_score_completions`), the rest ("training": grouping, advantages, forward, backward,
optimizer step, logging), and tokens/s of the training part (real prompt + completion tokens forwarded,
padding not counted). Ratios are hubgym over TRL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from results import write_section  # noqa: E402  (bench/ is on sys.path when run as a script)
HEADING = "## GRPO step: hubgym vs TRL's GRPOTrainer"
ENV = "arithmetic:tiny"
SIDES = ("hubgym", "hubgym-async", "trl")
MODELS = {  # name -> TinyModelConfig overrides
    "tiny": {},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 4},
}


def make_model(name: str, root: Path) -> Path:
    from hubgym.models.tiny import TinyModelConfig, make_tiny_model

    return make_tiny_model(root / f"bench-grpo-{name}", TinyModelConfig(**MODELS[name]))


# -- the hubgym side ----------------------------------------------------------------------------

def run_hubgym(args, model: Path, out: Path, async_steps: int = 0) -> list[dict]:
    from rich.console import Console

    from hubgym.train.config import TINY_CONFIG, load_config
    from hubgym.train.trainer import Trainer

    sets = [f"model={model}", f"output_dir={out}",  # envs: the default, arithmetic:tiny (ENV)
            f"online.steps={args.steps}", "eval.limit=0", "log.every=1000000", f"seed={args.seed}",
            f"batch.groups_per_step={args.groups}", f"grpo.n={args.n}", f"sampling.max_tokens={args.max_tokens}",
            f"loss.variant={args.loss}", f"optim.lr={args.lr}", "optim.bf16=false",
            "grpo.zero_variance=keep",  # TRL trains on every group, zero-advantage ones too
            f"online.async_steps={async_steps}", f"loss.max_staleness={async_steps}"]
    trainer = Trainer(load_config(TINY_CONFIG, sets), console=Console(file=open(os.devnull, "w")))
    try:
        result = trainer.run()
    finally:
        trainer.close()
    steps = []
    for line in result.metrics_file.read_text().splitlines():
        record = json.loads(line)
        if "time/step_s" not in record:
            continue
        if async_steps:  # sampling and syncs run beside training: only the wait is on the step's path
            sampling, sync = record["time/wait_s"], 0.0
        else:
            sampling, sync = record["time/generate_s"] + record["time/sync_s"], record["time/sync_s"]
        steps.append({"step_s": record["time/step_s"], "sampling_s": sampling, "sync_s": sync,
                      "tokens": record["train/tokens"]})
    return steps


# -- the TRL side --------------------------------------------------------------------------------

def run_trl(args, model: Path, out: Path) -> list[dict]:
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from hubgym.envs import open_env
    from hubgym.verifiers.arithmetic import correct

    tasks = open_env(ENV).take("train", None)
    train = datasets.Dataset.from_list([{"prompt": t["prompt"], "answer": str(t["info"]["answer"])} for t in tasks])

    def reward(prompts, completions, answer, **_) -> list[float]:
        return correct([{"info": {"answer": a}} for a in answer], completions)  # a batch reward: the whole batch

    config = GRPOConfig(
        output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=args.groups * args.n,
        num_generations=args.n, gradient_accumulation_steps=1, max_completion_length=args.max_tokens,
        temperature=1.0, top_p=1.0, loss_type=args.loss, epsilon=0.2, epsilon_high=0.28, beta=0.0,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        adam_beta1=0.9, adam_beta2=0.999, bf16=False, use_cpu=True, seed=args.seed, report_to=[],
        save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=str(model), reward_funcs=[reward], args=config, train_dataset=train,
                          processing_class=transformers.AutoTokenizer.from_pretrained(model))
    steps: list[dict] = []
    current: dict = {}
    generate = trainer._generate_and_score_completions

    def timed_generate(inputs):
        started = time.perf_counter()
        batch = generate(inputs)
        current["sampling_s"] = time.perf_counter() - started
        current["tokens"] = int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())
        return batch

    trainer._generate_and_score_completions = timed_generate

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            current.clear()
            current["started"] = time.perf_counter()

        def on_step_end(self, *_, **__):
            steps.append({"step_s": time.perf_counter() - current.pop("started"), **current})

    trainer.add_callback(StepTimer())
    trainer.train()
    return steps


# -- the run --------------------------------------------------------------------------------------

def side(args) -> None:
    """One side in this (child) process; its per-step timings go to --json."""
    model, out = Path(args.model_dir), Path(tempfile.mkdtemp(prefix=f"bench-{args.side}-"))
    runs = {"hubgym": run_hubgym, "hubgym-async": lambda *a: run_hubgym(*a, async_steps=1), "trl": run_trl}
    steps = runs[args.side](args, model, out)
    Path(args.json).write_text(json.dumps(steps))


def child(args, which: str, model: Path, work: Path) -> list[dict]:
    result = work / f"{which}.json"
    command = [sys.executable, __file__, "--side", which, "--model-dir", str(model), "--json", str(result),
               "--steps", str(args.steps), "--groups", str(args.groups), "--n", str(args.n),
               "--max-tokens", str(args.max_tokens), "--loss", args.loss, "--lr", str(args.lr),
               "--seed", str(args.seed)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {which} side failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads(result.read_text())


def summarize(steps: list[dict], warmup: int) -> dict[str, float]:
    kept = steps[warmup:]
    step = statistics.median(s["step_s"] for s in kept)
    sampling = statistics.median(s["sampling_s"] for s in kept)
    sync = statistics.median(s.get("sync_s", 0.0) for s in kept)
    training = statistics.median(s["step_s"] - s["sampling_s"] for s in kept)
    tokens = statistics.median(s["tokens"] for s in kept)
    return {"steps": len(kept), "step_s": step, "sampling_s": sampling, "sync_s": sync, "training_s": training,
            "tokens": tokens,
            "train_tokens_s": sum(s["tokens"] for s in kept) / sum(s["step_s"] - s["sampling_s"] for s in kept)}


def table(results: dict[str, dict[str, dict[str, float]]]):
    from rich.table import Table

    t = Table("model", "side", "steps", "s / step", "sampling s (waited)", "of which weight sync s", "training s",
              "tokens / step",
              "training tokens/s", "step time TRL / hubgym", "training tokens/s hubgym / TRL",
              title="one GRPO step (medians over the measured steps)")
    for model, sides in results.items():
        r = sides["trl"]
        for name, s in sides.items():
            ratios = ("", "") if name == "trl" else (f"{r['step_s'] / s['step_s']:.2f}x",
                                                      f"{s['train_tokens_s'] / r['train_tokens_s']:.2f}x")
            t.add_row(model, name, str(s["steps"]), f"{s['step_s']:.3f}", f"{s['sampling_s']:.3f}",
                      f"{s['sync_s']:.3f}", f"{s['training_s']:.3f}", f"{s['tokens']:,.0f}",
                      f"{s['train_tokens_s']:,.0f}", *ratios)
    return t


def parameters(model: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), "pt") as weights:
        return sum(_numel(weights.get_slice(name).get_shape()) for name in weights.keys())


def _numel(shape: list[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per side (warm-up included)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps not counted")
    parser.add_argument("--groups", type=int, default=4, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--loss", default="grpo", choices=["grpo", "dapo", "dr_grpo"])
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print the table, leave bench/RESULTS.md alone")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return side(args)

    from rich.console import Console
    from rich.progress import track

    import trl

    console, load = Console(width=200), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-trl-"))
    results: dict[str, dict[str, dict[str, float]]] = {}
    sizes: dict[str, int] = {}
    jobs = [(m, SIDES[(i + j) % len(SIDES)]) for i, m in enumerate(args.models) for j in range(len(SIDES))]
    for model_name, which in track(jobs, description="GRPO steps (one child process per side)", console=console):
        model = make_model(model_name, work)
        sizes[model_name] = parameters(model)
        results.setdefault(model_name, {})[which] = summarize(child(args, which, model, work), args.warmup)
    results = {m: {side: s[side] for side in SIDES} for m, s in results.items()}
    report = table(results)
    console.print(report)
    if not args.no_write:
        write_results(args, report, sizes, load, trl.__version__)


def write_results(args, report, sizes: dict[str, int], load, trl_version: str) -> None:
    import deepspeed
    import vllm
    from rich.console import Console

    capture = Console(width=160, record=True, file=open(os.devnull, "w"))
    capture.print(report)
    models = ", ".join(f"{m} ({sizes[m] / 1e6:.1f}M parameters)" for m in sizes)
    body = (f"Measured {dt.date.today()} with `python bench/bench_trl.py` on {platform.machine()} "
            f"({os.cpu_count()} cores, no GPU), load average {load[0]:.2f} at start; TRL {trl_version}, "
            f"vLLM {vllm.__version__}, DeepSpeed {deepspeed.__version__}. Models: {models}. One step = "
            f"{args.groups} prompts x {args.n} samples of `{ENV}`, at most {args.max_tokens} new tokens, loss "
            f"`{args.loss}`, {args.steps - args.warmup} measured steps per side after {args.warmup} of warm-up.\n\n"
            f"```\n{capture.export_text()}```\n")
    write_section(HEADING, body)


if __name__ == "__main__":
    main()
