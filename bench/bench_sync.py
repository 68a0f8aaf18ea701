"""Benchmark one weight sync into a running vLLM engine: the file channel against the in-memory one.

    python bench/bench_sync.py                      # tiny model and SmolLM2-135M; updates bench/RESULTS.md
    python bench/bench_sync.py --models tiny --syncs 3 --no-write

For each model one vLLM engine starts (its default dtype here), then the same perturbed weights (a
stand-in for a training step, fp32 as `Policy.full_state_dict` gives them) are synced `--syncs` times
through each channel, alternating (file, memory, file, ...), with `hubgym.train.sync.sync_weights`,
exactly as the trainer calls it. A sync counts from the state dict in hand to vLLM serving it (checks,
dtype conversion, the file write or the bucketed RPCs, vLLM's load, prefix cache reset). After each
sync the engine scores one fixed prompt, and both channels must give the same logprobs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def perturbed_state(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def prompt_logprobs(engine, ids: list[int]) -> list[float]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    out = engine.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
    return [entry[t].logprob for t, entry in zip(ids[1:], out.prompt_logprobs[1:])]


def bench_model(name: str, model_dir: str, syncs: int) -> dict:
    from hubgym.engines import VLLMEngine
    from hubgym.train.sync import engine_dtype, sync_weights

    state = perturbed_state(model_dir)
    engine = VLLMEngine(model_dir, max_model_len=512)
    ids = engine.tokenizer.encode("What is 2 + 3? Reply with just the number.")
    seconds = {"file": [], "memory": []}
    scored = {}
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(2 * syncs + 2):  # the first of each channel warms up and is not counted
            channel = ("file", "memory")[i % 2]
            started = time.perf_counter()
            sync_weights(engine, state, i + 1, Path(scratch) / channel, in_memory=channel == "memory")
            took = time.perf_counter() - started
            if i >= 2:
                seconds[channel].append(took)
            scored[channel] = prompt_logprobs(engine, ids)
    gap = max(abs(a - b) for a, b in zip(scored["file"], scored["memory"]))
    size = sum(t.numel() for t in state.values())
    dtype = str(engine_dtype(engine)).removeprefix("torch.")
    engine.close()
    return {"model": name, "params_m": size / 1e6, "dtype": dtype, "file_s": statistics.median(seconds["file"]),
            "memory_s": statistics.median(seconds["memory"]), "gap": gap, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2-135m")
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from hubgym.models import resolve_model

    rows = [bench_model(name, resolve_model(name), args.syncs) for name in args.models.split(",")]
    lines = ["| model | parameters | vLLM dtype | file sync s | in-memory sync s | max logprob gap | load avg |",
             "|---|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['params_m']:.1f}M | {r['dtype']} | {r['file_s']:.3f} | {r['memory_s']:.3f} | "
              f"{r['gap']:.1e} | {r['load']:.1f} |" for r in rows]
    body = (f"`python bench/bench_sync.py` ({dt.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
            f"median of {args.syncs} syncs per channel after one warm-up each)\n\n" + "\n".join(lines))
    print(body)
    if not args.no_write:
        from results import write_section

        write_section("## Weight sync into vLLM: file vs in memory", body)


if __name__ == "__main__":
    main()
