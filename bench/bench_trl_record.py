"""Benchmark a TRL GRPO step with and without hubgym's recorder (`env.record(trainer, out)`), side by side.

    python bench/bench_trl_record.py                       # tiny and small model; updates bench/RESULTS.md
    python bench/bench_trl_record.py --models tiny --rounds 2 --no-write

Both sides are TRL 1.16's GRPOTrainer with its default generation (`model.generate` in the training process) on
one hubgym env (`--env`, default `arithmetic:tiny`, its verifier as the reward through `trl_env`), the same model,
seed, batch and settings: `--prompts` prompts x `--n` samples a step, at most `--max-tokens` new tokens,
temperature 1, one process on the CPU. The only difference: one side calls `env.record(trainer, out)` before
`trainer.train()`, so every generation batch is also stored as hubgym rows (its forward hook reads the sampling
logprobs as the model generates; the step builds the rows and a writer process at the lowest CPU priority audits
and writes them).

Each side runs in its own child process, one after the other, and the pair is run `--rounds` times with the order
alternating (plain first, then recorded first...), so a machine that slows down or speeds up during the run weighs
on both sides alike. A step is timed by a TrainerCallback from `on_step_begin` to `on_step_end` (generation,
scoring, the recorder's hand-off, loss, backward, optimizer step); the first `--warmup` steps of each child are
not counted. Reported: the median step of each side over all rounds, their ratio (recorded / plain), the same per
round (how much the pair differs from round to round), and the recorder's own time, measured inside the
recorded side: on the step's path (its logprob hook during generation, building each batch's rows and handing
them to its writer), as seconds a step and as a share of the step, which load on the machine moves far less than
the A/B ratio;
and beside it, the CPU seconds its writer process spent auditing and writing a step's rows.
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
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from results import write_section  # noqa: E402  (bench/ is on sys.path when run as a script)

HEADING = "## TRL GRPO step with and without the recorder"
SIDES = ("plain", "recorded")
MODELS = {  # name -> TinyModelConfig overrides (as bench_trl.py)
    "tiny": {},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 4},
}


def make_model(name: str, root: Path) -> Path:
    from hubgym.models.tiny import TinyModelConfig, make_tiny_model

    return make_tiny_model(root / f"bench-record-{name}", TinyModelConfig(**MODELS[name]))


def side(args) -> None:
    """One side, in this (child) process: its step times (and the recorder's write seconds) go to --json."""
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from hubgym.integrations.trl import trl_env

    env = trl_env(args.env, split="train")
    work = Path(tempfile.mkdtemp(prefix=f"bench-record-{args.side}-"))
    config = GRPOConfig(
        output_dir=str(work / "trl"), max_steps=args.steps, per_device_train_batch_size=args.prompts * args.n,
        num_generations=args.n, max_completion_length=args.max_tokens, temperature=1.0, learning_rate=1e-3,
        bf16=False, use_cpu=True, seed=args.seed, report_to=[], save_strategy="no", logging_steps=1,
        disable_tqdm=True, reward_weights=env.reward_weights)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir, padding_side="left")
    trainer = GRPOTrainer(args.model_dir, args=config, processing_class=tokenizer, **env.trainer_kwargs())
    steps: list[float] = []
    started: list[float] = []

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            started.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            steps.append(time.perf_counter() - started[-1])

    trainer.add_callback(StepTimer())
    recorder = env.record(trainer, work / "run") if args.side == "recorded" else None
    trainer.train()
    Path(args.json).write_text(json.dumps({"steps": steps, "write_s": recorder.write_s if recorder else 0.0,
                                           "path_s": recorder.path_s if recorder else 0.0,
                                           "rows": recorder.rows_written if recorder else 0}))


def child(args, which: str, model: Path, work: Path, tag: str) -> dict:
    result = work / f"{tag}-{which}.json"
    command = [sys.executable, __file__, "--side", which, "--model-dir", str(model), "--json", str(result),
               "--env", args.env, "--steps", str(args.steps), "--prompts", str(args.prompts), "--n", str(args.n),
               "--max-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {which} side failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--env", default="arithmetic:tiny")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of child processes (order alternating)")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per child (warm-up included)")
    parser.add_argument("--warmup", type=int, default=1, help="first steps of each child not counted")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    parser.add_argument("--max-tokens", type=int, default=32)
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

    console, load = Console(width=200), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-trl-record-"))
    models = {name: make_model(name, work) for name in args.models}
    jobs = [(m, r, SIDES[(r + j) % 2]) for m in args.models for r in range(args.rounds) for j in range(2)]
    raw: dict[str, dict[str, list[dict]]] = {m: {s: [] for s in SIDES} for m in args.models}
    for model, round_, which in track(jobs, description="TRL steps (one child process per side)", console=console):
        raw[model][which].append(child(args, which, models[model], work, f"{model}-{round_}"))
    rows = summarize(raw, args.warmup)
    report = table(rows)
    console.print(report)
    if not args.no_write:
        write_results(args, report, load)


def summarize(raw: dict[str, dict[str, list[dict]]], warmup: int) -> list[dict]:
    out = []
    for model, sides in raw.items():
        kept = {s: [[t for t in run["steps"][warmup:]] for run in runs] for s, runs in sides.items()}
        median = {s: statistics.median(t for run in runs for t in run) for s, runs in kept.items()}
        per_round = [statistics.median(r) / statistics.median(p) for p, r in zip(kept["plain"], kept["recorded"])]
        recorded = sides["recorded"]
        steps = sum(len(run["steps"]) for run in recorded)
        out.append({"model": model, "plain_s": median["plain"], "recorded_s": median["recorded"],
                    "ratio": median["recorded"] / median["plain"], "rounds": per_round,
                    "write_s": sum(run["write_s"] for run in recorded) / max(steps, 1),
                    "path_s": sum(run["path_s"] for run in recorded) / max(steps, 1),
                    "path_share": sum(run["path_s"] for run in recorded) / sum(sum(run["steps"]) for run in recorded),
                    "rows": sum(run["rows"] for run in recorded) // max(len(recorded), 1),
                    "steps": sum(len(r) for r in kept["plain"])})
    return out


def table(rows: list[dict]):
    from rich.table import Table

    t = Table("model", "steps a side", "s / step plain", "s / step recorded", "recorded / plain",
              "per round (recorded / plain)", "recorder on the step's path, s / step (share)",
              "writer process CPU s / step (beside it)", "rows stored a child",
              title="one TRL GRPO step, median over the measured steps of every round")
    for r in rows:
        t.add_row(r["model"], str(r["steps"]), f"{r['plain_s']:.3f}", f"{r['recorded_s']:.3f}", f"{r['ratio']:.3f}",
                  " ".join(f"{x:.3f}" for x in r["rounds"]), f"{r['path_s']:.4f} ({100 * r['path_share']:.2f}%)",
                  f"{r['write_s']:.3f}", str(r["rows"]))
    return t


def write_results(args, report, load) -> None:
    import transformers
    import trl
    from rich.console import Console

    capture = Console(width=170, record=True, file=open(os.devnull, "w"))
    capture.print(report)
    body = (f"Measured {dt.date.today()} with `python bench/bench_trl_record.py` on {platform.machine()} "
            f"({os.cpu_count()} cores, no GPU), load average {load[0]:.2f} at start; TRL {trl.__version__} (its "
            f"transformers generation), transformers {transformers.__version__}. One step = {args.prompts} prompts x "
            f"{args.n} samples of `{args.env}`, at most {args.max_tokens} new tokens; {args.rounds} rounds of the "
            f"two sides (order alternating), {args.steps - args.warmup} measured steps per child after "
            f"{args.warmup} of warm-up.\n\n```\n{capture.export_text()}```\n")
    write_section(HEADING, body)


if __name__ == "__main__":
    main()
