"""Training-step throughput and MFU of hubgym's GRPO step on a GPU, beside a bare DeepSpeed loop.

    python bench/bench_mfu.py                           # on a GPU: a random Qwen2-0.5B-shaped model, 4k tokens
    python bench/bench_mfu.py --preset qwen2-0.5b --preset smollm2-135m   # both real-model shapes, one table
    python bench/bench_mfu.py --preset tiny --seq-len 256 --sequences 4 --steps 2   # a smoke run (CPU too)

The model is made here, randomly initialized from a config, so nothing is downloaded (a GPU machine
may have no network, and SmolLM2's 538 MB of weights would not travel with the repository; a step's
speed does not depend on the weights' values): `--preset qwen2-0.5b` is Qwen2-0.5B's shape (24
layers, hidden 896, 14 heads / 2 KV heads, vocab 151,936, tied embeddings, about 494M parameters),
`--preset smollm2-135m` SmolLM2-135M-Instruct's, as its config.json has it (LlamaForCausalLM: 30
layers, hidden 576, 9 heads / 3 KV heads of 64, MLP 1,536, vocab 49,152, tied embeddings, rope theta
1e5, 134.5M parameters). Each preset runs in its own child process (one model's engines and memory
are gone before the next starts); their rows share one table.

A step is `--sequences` rollouts of exactly `--seq-len` tokens (prompt + completion, random ids),
read from an Arrow shard and trained the way the trainer does it: GroupStream (groups, advantages)
-> pack_step (`--budget` tokens per micro-batch) -> the GRPO loss with its metrics -> Policy.train_step (DeepSpeed ZeRO-2, bf16 where supported, torch AdamW). The bare loop trains the same
packed micro-batches with the same DeepSpeed config and only forward, a masked policy-gradient loss,
backward and the optimizer step. Steps alternate between the two after a warm-up of each.

MFU counts model FLOPs per trained token as 6 x (parameters in matmuls: all but the input embedding,
the tied head counted once) + 12 x layers x hidden x sequence length (attention scores and values,
forward and backward; the PaLM convention, causal masking not discounted), over the GPU's dense bf16
peak (H100 SXM and H200: 989 TFLOP/s, H100 PCIe: 756; `--peak-tflops` for others). Recomputation under
`--gradient-checkpointing` is not counted (that would be hardware FLOPs utilization). Results are
written to bench/RESULTS.md only when a GPU ran them.

Diagnostics: `--profile` adds each side's GPU-busy share and kernel count over one more step (a step
bound by the host launching kernels shows a low share); `--profile-ops` prints each side's GPU time by
operator; `--no-entropy` drops the loss's entropy metric from hubgym's side, to price it.
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

from bench_train import bare_step, hubgym_step  # noqa: E402  (bench/ is on sys.path when run as a script)
from results import write_section  # noqa: E402

HEADING = "## Training step on a GPU: tokens/s and MFU"
PRESETS = {  # model_type and its config's values
    "qwen2-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6)),
    # SmolLM2-135M-Instruct's config.json (hubgym.models.resolve_model("smollm2-135m")), weights aside.
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                                   tie_word_embeddings=True, rope_theta=1e5, rms_norm_eps=1e-5, hidden_act="silu",
                                   bos_token_id=1, eos_token_id=2, pad_token_id=2)),
    "tiny": ("qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True)),
}
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

    from test_train_stream import row  # the test suite's complete, schema-valid rollout row

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
    params = sum(p.numel() for p in model.parameters()) - (0 if tied else embedding.numel())
    return 6 * params + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len


def peak_flops(override: float | None) -> float | None:
    if override:
        return override * 1e12
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((tflops * 1e12 for key, tflops in PEAK_BF16_TFLOPS.items() if key in name), None)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", choices=list(PRESETS),
                        help="model shape; repeat for several (default: qwen2-0.5b)")
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (prompt + completion)")
    parser.add_argument("--sequences", type=int, default=16, help="sequences per optimizer step")
    parser.add_argument("--n", type=int, default=8, help="group size")
    parser.add_argument("--budget", type=int, default=None, help="tokens per micro-batch (default: one sequence)")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per side")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of this accelerator")
    parser.add_argument("--profile", action="store_true",
                        help="one more step per side under torch.profiler: the GPU's busy share and kernel count")
    parser.add_argument("--profile-ops", action="store_true",
                        help="print each side's GPU time by operator over one more profiled step")
    parser.add_argument("--no-entropy", action="store_true",
                        help="hubgym's loss without its entropy metric (make_loss_fn(with_entropy=False))")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child-json", type=Path, default=None, help=argparse.SUPPRESS)  # one preset, to a file
    args = parser.parse_args()
    args.preset = args.preset or ["qwen2-0.5b"]
    return args


def main() -> None:
    args = parse_args()
    if args.child_json:
        args.child_json.write_text(json.dumps(measure(args, args.preset[0])))
        return
    from rich.console import Console

    console = Console(width=140)
    results = [run_child(args, preset) for preset in args.preset]
    table = results_table(results)
    console.print(table)
    if args.no_write or not torch.cuda.is_available():
        console.print("not written to bench/RESULTS.md" + ("" if torch.cuda.is_available() else " (no GPU)"))
        return
    write_results(args, table, results)


def run_child(args: argparse.Namespace, preset: str) -> dict:
    """Measure one preset in a fresh process, so its engines and GPU memory are gone before the next."""
    options = ["--seq-len", args.seq_len, "--sequences", args.sequences, "--n", args.n, "--steps", args.steps]
    options += ["--budget", args.budget] if args.budget else []
    options += ["--peak-tflops", args.peak_tflops] if args.peak_tflops else []
    options += ["--gradient-checkpointing"] if args.gradient_checkpointing else []
    options += ["--profile"] if args.profile else []
    options += ["--profile-ops"] if args.profile_ops else []
    options += ["--no-entropy"] if args.no_entropy else []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([sys.executable, __file__, "--preset", preset, *map(str, options), "--child-json", str(out)],
                       check=True)
        return json.loads(out.read_text())


def measure(args: argparse.Namespace, preset: str) -> dict:
    """Both sides' steps on one preset: tokens/s, TFLOP/s and MFU per side, and the GPU's peak memory."""
    import deepspeed
    from transformers import AutoModelForCausalLM

    from hubgym.rollout.writer import ShardWriter
    from hubgym.train.engine import DeepSpeedSettings, Policy, deepspeed_config
    from hubgym.train.groups import GroupSettings
    from hubgym.train.loss import LossSettings, make_loss_fn
    from hubgym.train.packing import pack_step
    from hubgym.train.stream import GroupStream

    budget = args.budget or args.seq_len
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(preset, args.seq_len, Path(tmp) / "model")
        rows = make_rows(args.sequences, args.n, args.seq_len, PRESETS[preset][1]["vocab_size"])
        writer = ShardWriter(Path(tmp) / "run", "w000of001", max_rows=len(rows))
        writer.add_group(rows)
        writer.flush()
        settings = DeepSpeedSettings(lr=1e-5, gradient_checkpointing=args.gradient_checkpointing)
        policy = Policy(model_dir, settings)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        bare, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-5),
                                        config=deepspeed_config(settings))
        groups = GroupSettings(n=args.n, zero_variance="keep")
        [batches] = pack_step(list(GroupStream([rows], groups)), budget)
        batches = [b.to(bare.device) for b in batches]
        loss_fn = make_loss_fn(LossSettings(variant="grpo"), with_entropy=not args.no_entropy)
        sides = {"bare": lambda: bare_step(bare, batches),
                 "hubgym": lambda: hubgym_step(policy, Path(tmp) / "run", groups, loss_fn, budget)}
        for run in sides.values():
            run()  # warm-up
        times: dict[str, list[tuple[int, float]]] = {"bare": [], "hubgym": []}
        for i in range(2 * args.steps):
            side = ["bare", "hubgym", "hubgym", "bare"][i % 4]
            _synchronize()
            times[side].append(sides[side]())
            _synchronize()
        profiled = {side: profile_step(run) for side, run in sides.items()} if args.profile else {}
        for side, run in sides.items() if args.profile_ops else ():
            print(f"{preset}, {side}: GPU time by operator over one step\n{profile_step_ops(run)}", flush=True)
        per_token, peak = flops_per_token(policy.module, args.seq_len), peak_flops(args.peak_tflops)
        params = sum(p.numel() for p in model.parameters())
    result = {"preset": preset, "params": params, "seq_len": args.seq_len, "micro_batches": len(batches),
              "budget": budget, "peak_memory_gib": _peak_memory_gib(), "device": _device_name(), "sides": {}}
    for side, runs in times.items():
        rate = statistics.median(t / s for t, s in runs)
        result["sides"][side] = {"tokens": runs[0][0], "step_s": statistics.median(s for _, s in runs),
                                 "tokens_s": rate, "tflops": rate * per_token / 1e12,
                                 "mfu": rate * per_token / peak if peak else None, **profiled.get(side, {})}
    return result


def profile_step_ops(run) -> str:
    """One more step under torch.profiler (host and GPU): the operators that took the most GPU time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    _synchronize()
    with profile(activities=activities) as prof:
        run()
        _synchronize()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)


def profile_step(run) -> dict:
    """One more step under torch.profiler: the share of its wall time in which a GPU kernel ran (the union of
    the kernels' spans) and how many kernels it launched. A low share with many kernels: the host, launching
    small kernels one at a time, not the GPU's arithmetic, sets the pace."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return {}
    _synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        run()
        _synchronize()
        seconds = time.perf_counter() - started
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA)
    busy, reached = 0.0, float("-inf")
    for start, end in spans:
        if end > reached:
            busy += end - max(start, reached)
            reached = end
    return {"gpu_busy": busy / 1e6 / seconds, "kernels": len(spans)}


def results_table(results: list[dict]):
    from rich.table import Table

    profiled = "gpu_busy" in results[0]["sides"]["bare"]
    extra = ["GPU busy (profiled step)", "kernels / step"] if profiled else []
    table = Table("model", "side", "tokens / step", "median step s", "tokens/s", "TFLOP/s", "MFU", "vs bare",
                  "peak GPU memory GiB", *extra,
                  title=f"GRPO training step, {results[0]['seq_len']} tokens per sequence")
    for r in results:
        bare = r["sides"]["bare"]["tokens_s"]
        for side, m in r["sides"].items():
            table.add_row(f"{r['preset']} ({r['params'] / 1e6:.1f}M)", side, f"{m['tokens']:,}", f"{m['step_s']:.3f}",
                          f"{m['tokens_s']:,.0f}", f"{m['tflops']:.1f}",
                          f"{m['mfu']:.1%}" if m["mfu"] is not None else "n/a", f"{m['tokens_s'] / bare:.3f}",
                          f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] is not None else "n/a",
                          *([f"{m['gpu_busy']:.0%}", f"{m['kernels']:,}"] if profiled else []))
    return table


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_memory_gib() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"


def write_results(args, table, results: list[dict]) -> None:
    import deepspeed
    from rich.console import Console

    capture = Console(width=200, record=True, file=open(os.devnull, "w"))
    capture.print(table)
    r = results[0]
    flags = " ".join([f"--preset {x['preset']}" for x in results] + (["--profile"] if args.profile else [])
                     + ([f"--budget {args.budget}"] if args.budget else [])
                     + (["--no-entropy"] if args.no_entropy else []))
    body = (f"Measured {dt.date.today()} with `python bench/bench_mfu.py {flags}` on {r['device']} "
            f"({platform.machine()}), torch {torch.__version__}, DeepSpeed {deepspeed.__version__}. One step = "
            f"{args.sequences} sequences of {args.seq_len} tokens in {r['micro_batches']} micro-batches of at most "
            f"{r['budget']} tokens, ZeRO-2, bf16, "
            f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}, "
            f"{args.steps} measured steps per side, alternating, after a warm-up step of each.\n\n"
            f"```\n{capture.export_text()}```\n")
    write_section(HEADING, body)


if __name__ == "__main__":
    main()
