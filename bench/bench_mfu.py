"""Training-step throughput, MFU and peak memory of hubgym's GRPO step beside a bare DeepSpeed loop (and TRL).

    python bench/bench_mfu.py --preset qwen2-0.5b --preset smollm2-135m --budget 4096 --budget 16384 --profile
    python bench/bench_mfu.py --preset qwen2.5-1.5b --budget 16384 --zero-stage 3 --gradient-checkpointing --no-bare
    python bench/bench_mfu.py --preset qwen2-0.5b --budget 4096 --trl       # TRL's GRPOTrainer step as a third side
    python bench/bench_mfu.py --device cpu --preset tiny-49k --seq-len 512 --sequences 8 --budget 2048 --steps 2

The model is made here, randomly initialized from a config, so nothing is downloaded (a GPU machine
may have no network, and SmolLM2's 538 MB of weights would not travel with the repository; a step's
speed does not depend on the weights' values): `--preset qwen2-0.5b` is Qwen2-0.5B's shape (24
layers, hidden 896, 14 heads / 2 KV heads, vocab 151,936, tied embeddings, about 494M parameters),
`--preset smollm2-135m` SmolLM2-135M-Instruct's, as its config.json has it (LlamaForCausalLM: 30
layers, hidden 576, 9 heads / 3 KV heads of 64, MLP 1,536, vocab 49,152, tied embeddings, rope theta
1e5, 134.5M parameters), `--preset qwen2.5-1.5b` Qwen2.5-1.5B's (28 layers, hidden 1,536, 12 heads /
2 KV heads, MLP 8,960, vocab 151,936, tied embeddings, about 1.54B parameters: the one to run under
`--zero-stage 3 --gradient-checkpointing` at 16,384-token micro-batches on one 80 GB card), and
`tiny` / `tiny-49k` a 2-layer model of hidden 64 with a 1,024- or SmolLM2's 49,152-token vocabulary
(the latter: a CPU-sized model whose memory the output layer dominates, as a real model's does at
long micro-batches). Each (preset, budget) runs in its own child process (one model's engines and
memory are gone before the next starts); their rows share one table.

A step is `--sequences` rollouts of exactly `--seq-len` tokens (prompt + completion, random ids),
read from an Arrow shard and trained the way the trainer does it: GroupStream (groups, advantages)
-> pack_step (`--budget` tokens per micro-batch) -> the GRPO loss with its metrics -> Policy.train_step
(DeepSpeed ZeRO-2 or 3, bf16 where supported, torch AdamW). The bare loop trains the same packed
micro-batches with the same DeepSpeed config and only forward (whole logits), a masked policy-gradient
loss, backward and the optimizer step. With `--trl` (and trl importable) a third side runs TRL's
GRPOTrainer on the same sequences in micro-batches of the same size: its compute_loss (the `grpo`
loss, clip 0.2/0.28, no KL) under its accelerator's autocast, backward, gradient clipping and its
AdamW step, TRL's generation replaced by the fixed batch. Steps rotate between the sides after a
warm-up of each. `--no-bare` runs hubgym's side alone (where a second model's state would not fit).

MFU counts model FLOPs per trained token as 6 x (parameters in matmuls: all but the input embedding,
the tied head counted once) + 12 x layers x hidden x sequence length (attention scores and values,
forward and backward; the PaLM convention, causal masking not discounted), over the GPU's dense bf16
peak (H100 SXM and H200: 989 TFLOP/s, H100 PCIe: 756; `--peak-tflops` for others). Recomputation under
`--gradient-checkpointing` is not counted (that would be hardware FLOPs utilization).

Peak memory is per side: on a GPU the allocator's peak over that side's steps (both sides' weights and
optimizer states are resident throughout, so the difference is the step's own), on a CPU the process's
resident set sampled every 2 ms during that side's steps. Results are written to bench/RESULTS.md
(the GPU or the CPU section) unless `--no-write`; `--json FILE` also writes them as JSON.

Diagnostics: `--profile` adds each side's GPU-busy share and kernel count (on a CPU: aten operator
calls) over one more step (a step bound by the host launching kernels shows a low share);
`--profile-ops` prints each side's time by operator; `--no-entropy` drops the loss's entropy metric
from hubgym's side, to price it; `--compile` runs hubgym's side with `optim.compile`.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

import bench_train  # noqa: E402  (bench/ is on sys.path when run as a script)
from results import write_section  # noqa: E402

HEADING = "## Training step on a GPU: tokens/s and MFU"
CPU_HEADING = "## Training step on a CPU: peak memory beside the bare loop"
SIDES = ("bare", "hubgym", "trl")
PRESETS = {  # model_type and its config's values
    "qwen2-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6)),
    # SmolLM2-135M-Instruct's config.json (hubgym.models.resolve_model("smollm2-135m")), weights aside.
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                                   tie_word_embeddings=True, rope_theta=1e5, rms_norm_eps=1e-5, hidden_act="silu",
                                   bos_token_id=1, eos_token_id=2, pad_token_id=2)),
    # Qwen2.5-1.5B(-Instruct)'s config.json, weights aside.
    "qwen2.5-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                   tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)),
    "tiny": ("qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True)),
    "tiny-49k": ("qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True)),
}
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # a parent's process group
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "GH200": 989.4, "A100": 312.0}


def make_model(preset: str, seq_len: int, folder: Path) -> Path:
    """A randomly initialized model of the preset's shape saved as a Hugging Face folder (seeded, so runs agree)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, values = PRESETS[preset]
    config = AutoConfig.for_model(model_type, **values, max_position_embeddings=max(seq_len, 4096), dtype="float32")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def make_rows(sequences: int, n: int, seq_len: int, vocab: int) -> list[dict]:
    """`sequences` rollouts of exactly `seq_len` tokens (1/8 prompt), in groups of `n` with 0/1 rewards."""
    import random

    from helpers.stream_rows import row  # the test suite's complete, schema-valid rollout row

    rng, prompt = random.Random(0), seq_len // 8
    completion = seq_len - prompt
    return [row("bench", i // n, i % n, float(i % 2), n_prompt=prompt, n_completion=completion,
                prompt_ids=[rng.randrange(3, vocab) for _ in range(prompt)],
                completion_ids=[rng.randrange(3, vocab) for _ in range(completion)],
                completion_logprobs=[-11.0] * completion) for i in range(sequences)]


def flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    cfg = model.config
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embedding
    params = _ds_numel(model) - (0 if tied else getattr(embedding, "ds_numel", embedding.numel()))
    return 6 * params + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len


def peak_flops(override: float | None) -> float | None:
    if override:
        return override * 1e12
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((tflops * 1e12 for key, tflops in PEAK_BF16_TFLOPS.items() if key in name), None)


def parse_args(argv: list[str] | None = None, here: bool = True) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", choices=list(PRESETS),
                        help="model shape; repeat for several (default: qwen2-0.5b)")
    parser.add_argument("--budget", action="append", type=int,
                        help="tokens per micro-batch; repeat for several (default: one sequence)")
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (prompt + completion)")
    parser.add_argument("--sequences", type=int, default=16, help="sequences per optimizer step")
    parser.add_argument("--n", type=int, default=8, help="group size")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per side")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to train (default: a GPU when there is one)")
    parser.add_argument("--zero-stage", type=int, choices=[2, 3], default=2)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true", help="hubgym's side with optim.compile (torch.compile)")
    parser.add_argument("--output-layer", choices=["fused", "chunked", "liger"], default="fused",
                        help="hubgym's loss.output_layer")
    parser.add_argument("--trl", action="store_true", help="add TRL's GRPOTrainer step as a third side")
    parser.add_argument("--no-bare", action="store_true",
                        help="hubgym's side alone (no bare loop's weights, AdamW state and whole logits beside it: "
                             "what fits one card when the two would not)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of this accelerator")
    parser.add_argument("--profile", action="store_true",
                        help="one more step per side under torch.profiler: the GPU's busy share and kernel count")
    parser.add_argument("--profile-ops", action="store_true",
                        help="print each side's time by operator over one more profiled step")
    parser.add_argument("--no-entropy", action="store_true",
                        help="hubgym's loss without its entropy metric (make_loss_fn(with_entropy=False))")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("--from-json", type=Path, action="append",
                        help="measure nothing: show (and write, as one section) the results that --json runs saved, "
                             "e.g. on a GPU machine whose files come back without the repository; repeatable")
    parser.add_argument("--child-json", type=Path, default=None, help=argparse.SUPPRESS)  # one run, to a file
    args = parser.parse_args(argv)
    args.preset = args.preset or ["qwen2-0.5b"]
    args.budget = args.budget or [args.seq_len]
    if here and args.device == "cuda" and not torch.cuda.is_available() and not args.from_json:
        parser.error("--device cuda: no GPU here; use --device cpu")
    if here and args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # DeepSpeed then picks its CPU accelerator, gloo
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child_json:
        args.child_json.write_text(json.dumps(measure(args, args.preset[0], args.budget[0])))
        return
    from rich.console import Console

    import deepspeed

    console = Console(width=160)
    if args.from_json:  # the runs' own arguments and versions, for the section's text
        runs = [json.loads(path.read_text()) for path in args.from_json]
        results = [r for run in runs for r in run["results"]]
        versions, commands = runs[0]["versions"], [run["argv"] for run in runs]
        args = parse_args(runs[0]["argv"], here=False) if not args.no_write else args
    else:
        results = [run_child(args, preset, budget) for preset in args.preset for budget in args.budget]
        versions, commands = {"torch": torch.__version__, "deepspeed": deepspeed.__version__}, [sys.argv[1:]]
    table = results_table(results)
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "versions": versions, "results": results}, indent=1))
    if args.no_write:
        console.print("not written to bench/RESULTS.md (--no-write)")
        return
    write_results(args, table, results, versions, commands)


def run_child(args: argparse.Namespace, preset: str, budget: int) -> dict:
    """Measure one preset at one budget in a fresh process, so its engines and memory are gone before the next.
    A run that fails (out of memory, say) is a row saying so, not the end of the others."""
    options = ["--seq-len", args.seq_len, "--sequences", args.sequences, "--n", args.n, "--steps", args.steps,
               "--device", args.device, "--zero-stage", args.zero_stage, "--budget", budget,
               "--output-layer", args.output_layer]
    options += ["--peak-tflops", args.peak_tflops] if args.peak_tflops else []
    flags = ("gradient_checkpointing", "compile", "trl", "no_bare", "profile", "profile_ops", "no_entropy")
    options += [f"--{flag.replace('_', '-')}" for flag in flags if getattr(args, flag)]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}  # each child is its own one-process group
        done = subprocess.run([sys.executable, __file__, "--preset", preset, *map(str, options), "--child-json",
                               str(out)], env=env)
        if done.returncode or not out.exists():
            return {"preset": preset, "budget": budget, "seq_len": args.seq_len, "failed": done.returncode}
        return json.loads(out.read_text())


def measure(args: argparse.Namespace, preset: str, budget: int) -> dict:
    """Every side's steps on one preset and budget: tokens/s, TFLOP/s and MFU per side, and each side's peak
    memory."""
    import deepspeed

    from hubgym.rollout.writer import ShardWriter
    from hubgym.train.engine import DeepSpeedSettings, Policy, deepspeed_config, load_model
    from hubgym.train.groups import GroupSettings
    from hubgym.train.loss import LossSettings, make_loss_fn
    from hubgym.train.packing import pack_step
    from hubgym.train.stream import GroupStream

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(preset, args.seq_len, Path(tmp) / "model")
        rows = make_rows(args.sequences, args.n, args.seq_len, PRESETS[preset][1]["vocab_size"])
        writer = ShardWriter(Path(tmp) / "run", "w000of001", max_rows=len(rows))
        writer.add_group(rows)
        writer.flush()
        settings = DeepSpeedSettings(lr=1e-5, gradient_checkpointing=args.gradient_checkpointing,
                                     zero_stage=args.zero_stage, compile=args.compile)
        policy = Policy(model_dir, settings)
        groups = GroupSettings(n=args.n, zero_variance="keep")
        [batches] = pack_step(list(GroupStream([rows], groups)), budget)
        loss_fn = make_loss_fn(LossSettings(variant="grpo", output_layer=args.output_layer),
                               with_entropy=not args.no_entropy)
        sides = {"hubgym": lambda: hubgym_step(policy, Path(tmp) / "run", groups, loss_fn, budget)}
        if not args.no_bare:
            bare_config = deepspeed_config(settings)
            model = load_model(model_dir, bare_config)
            if args.gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            bare, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-5),
                                            config=bare_config)
            moved = [b.to(bare.device) for b in batches]
            sides = {"bare": lambda: bare_step(bare, moved), **sides}
        if args.trl:
            trl = trl_side(args, model_dir, rows, budget, Path(tmp) / "trl")
            if trl is not None:
                sides["trl"] = trl
        for run in sides.values():
            run()  # warm-up
        times: dict[str, list[tuple[int, float]]] = {side: [] for side in sides}
        peaks: dict[str, float] = {side: 0.0 for side in sides}
        order = rotation(list(sides))
        for i in range(len(sides) * args.steps):
            side = order[i % len(order)]
            with PeakMemory(args.device) as memory:
                times[side].append(sides[side]())
            peaks[side] = max(peaks[side], memory.peak_gib)
        profiled = {side: profile_step(run, args.device) for side, run in sides.items()} if args.profile else {}
        for side, run in sides.items() if args.profile_ops else ():
            print(f"{preset}, {side}: time by operator over one step\n{profile_step_ops(run)}", flush=True)
        per_token, peak = flops_per_token(policy.module, args.seq_len), peak_flops(args.peak_tflops)
        params = _ds_numel(policy.module)
    result = {"preset": preset, "params": params, "seq_len": args.seq_len, "micro_batches": len(batches),
              "budget": budget, "device": _device_name(args.device), "zero_stage": args.zero_stage,
              "setup": setup(args), "sides": {}}
    for side, runs in times.items():
        rate = statistics.median(t / s for t, s in runs)
        result["sides"][side] = {"tokens": runs[0][0], "step_s": statistics.median(s for _, s in runs),
                                 "tokens_s": rate, "tflops": rate * per_token / 1e12,
                                 "mfu": rate * per_token / peak if peak else None, "peak_memory_gib": peaks[side],
                                 **profiled.get(side, {})}
    return result


def setup(args: argparse.Namespace) -> str:
    """How a row was trained, in a few words: ZeRO stage and the options that change a step."""
    options = [f"ZeRO-{args.zero_stage}"] + [name for name, on in (
        ("checkpointing", args.gradient_checkpointing), ("compile", args.compile),
        (f"output layer {args.output_layer}", args.output_layer != "fused"), ("no entropy", args.no_entropy),
        ("hubgym alone", args.no_bare)) if on]
    return ", ".join(options)


def rotation(sides: list[str]) -> list[str]:
    """A palindrome, so that no side always runs first or last: bare, hubgym, hubgym, bare (a b c c b a)."""
    return sides + sides[::-1]


def hubgym_step(policy, shard_dir: Path, settings, loss_fn, budget: int) -> tuple[int, float]:
    """bench_train's hubgym step (rows read from the shard, grouped, packed, trained), timed to the device's end."""
    started = time.perf_counter()
    tokens, _ = bench_train.hubgym_step(policy, shard_dir, settings, loss_fn, budget)
    _synchronize()
    return tokens, time.perf_counter() - started


def bare_step(engine, batches) -> tuple[int, float]:
    started = time.perf_counter()
    tokens, _ = bench_train.bare_step(engine, batches)
    _synchronize()
    return tokens, time.perf_counter() - started


def trl_side(args, model_dir: Path, rows: list[dict], budget: int, out: Path):
    """TRL's GRPOTrainer stepping on the same sequences (None, said once, when trl is not installed)."""
    try:
        import trl  # noqa: F401
    except ImportError:
        print("--trl: trl is not installed (pip install 'hubgym[bench]'); TRL's side is left out", flush=True)
        return None
    from trl_step import TrlStep

    stepper = TrlStep(model_dir, rows, n=args.n, per_micro_batch=max(1, budget // args.seq_len), out=out,
                      gradient_checkpointing=args.gradient_checkpointing, cpu=args.device == "cpu")

    def run() -> tuple[int, float]:
        started = time.perf_counter()
        tokens = stepper.step()
        _synchronize()
        return tokens, time.perf_counter() - started
    return run


class PeakMemory:
    """The peak memory of what runs inside: the GPU allocator's peak, or the CPU process's resident set sampled
    on a thread every 2 ms."""

    def __init__(self, device: str):
        self.device, self.peak_gib = device, 0.0

    def __enter__(self) -> "PeakMemory":
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return self
        import threading

        import psutil

        process, self._stop = psutil.Process(), threading.Event()
        self._peak = process.memory_info().rss

        def sample() -> None:
            while not self._stop.wait(0.002):
                self._peak = max(self._peak, process.memory_info().rss)
        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_gib = torch.cuda.max_memory_allocated() / 2**30
            return
        self._stop.set()
        self._thread.join()
        self.peak_gib = self._peak / 2**30


def profile_step_ops(run) -> str:
    """One more step under torch.profiler (host and GPU): the operators that took the most time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    _synchronize()
    with profile(activities=activities) as prof:
        run()
        _synchronize()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)


def profile_step(run, device: str) -> dict:
    """One more step under torch.profiler. On a GPU: the share of its wall time in which a kernel ran (the
    union of the kernels' spans) and how many kernels it launched; a low share with many kernels: the host,
    launching small kernels one at a time, not the GPU's arithmetic, sets the pace. On a CPU: how many aten
    operators it called (what the host dispatches)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU
    _synchronize()
    with profile(activities=[activity]) as prof:
        started = time.perf_counter()
        run()
        _synchronize()
        seconds = time.perf_counter() - started
    if device != "cuda":
        return {"kernels": sum(1 for e in prof.events() if e.name.startswith("aten::"))}
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA)
    busy, reached = 0.0, float("-inf")
    for start, end in spans:
        if end > reached:
            busy += end - max(start, reached)
            reached = end
    return {"gpu_busy": busy / 1e6 / seconds, "kernels": len(spans)}


def results_table(results: list[dict]):
    from rich.table import Table

    done = [r for r in results if "sides" in r]
    cuda = any("gpu_busy" in m for r in done for m in r["sides"].values())
    profiled = any("kernels" in m for r in done for m in r["sides"].values())
    extra = (["GPU busy (profiled step)"] if cuda else []) + (["kernels / step" if cuda else "aten ops / step"]
                                                              if profiled else [])
    table = Table("model", "budget", "setup", "side", "tokens / step", "median step s", "tokens/s", "TFLOP/s", "MFU",
                  "vs bare", "peak memory GiB", *extra,
                  title=f"GRPO training step, {results[0]['seq_len']} tokens per sequence")
    for r in results:
        if "sides" not in r:
            table.add_row(r["preset"], f"{r['budget']:,}", r.get("setup", ""), "failed", f"exit status {r['failed']}")
            continue
        bare = r["sides"]["bare"]["tokens_s"] if "bare" in r["sides"] else None
        for side, m in r["sides"].items():
            table.add_row(f"{r['preset']} ({r['params'] / 1e6:.1f}M)", f"{r['budget']:,}", r.get("setup", ""), side,
                          f"{m['tokens']:,}",
                          f"{m['step_s']:.3f}", f"{m['tokens_s']:,.0f}", f"{m['tflops']:.2f}",
                          f"{m['mfu']:.1%}" if m["mfu"] is not None else "n/a",
                          f"{m['tokens_s'] / bare:.3f}" if bare else "n/a",
                          f"{m['peak_memory_gib']:.2f}",
                          *([f"{m['gpu_busy']:.0%}" if "gpu_busy" in m else "-"] if cuda else []),
                          *([f"{m['kernels']:,}" if "kernels" in m else "-"] if profiled else []))
    return table


def _ds_numel(module: torch.nn.Module) -> int:
    """Parameters of a model, counted whole under ZeRO-3 too (where each local tensor is an empty shard)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters())


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"{platform.machine()} CPU ({os.cpu_count()} cores)"


def write_results(args, table, results: list[dict], versions: dict[str, str], commands: list[list[str]]) -> None:
    from rich.console import Console

    capture = Console(width=220, record=True, file=open(os.devnull, "w"))
    capture.print(table)
    r = next((x for x in results if "sides" in x), results[0])
    skip = {"--json", "--no-write", "--child-json"}
    shown = ["python bench/bench_mfu.py " + " ".join(a for i, a in enumerate(argv) if a not in skip
                                                     and (i == 0 or argv[i - 1] not in skip)) for argv in commands]
    body = (f"Measured {dt.date.today()} with {'; '.join(f'`{c.strip()}`' for c in shown)} on {r.get('device')}, "
            f"torch {versions['torch']}, DeepSpeed {versions['deepspeed']}. One step = {args.sequences} sequences "
            f"of {args.seq_len} tokens in micro-batches of at most the budget's tokens, "
            f"{'fp32' if 'CPU' in str(r.get('device')) else 'bf16'}, the ZeRO stage and options of each row's "
            f"setup, {args.steps} measured steps per side, rotating, after a warm-up step of each.\n\n"
            f"```\n{capture.export_text()}```\n")
    write_section(CPU_HEADING if "CPU" in str(r.get("device")) else HEADING, body)

if __name__ == "__main__":
    main()
