"""vLLM on a CPU with its engine core in a process of its own (as under `hubgym train`): the engine as hubgym
builds it (the model's worker in the core's process, hubgym's worker extension) vs vLLM's own CPU layout (the
worker in a third process), fresh processes taking turns.

    python bench/bench_worker.py                          # --model tiny, 3 rounds
    python bench/bench_worker.py --model smollm2-135m --rounds 1 --no-write

Each measurement is a fresh Python process with VLLM_ENABLE_V1_MULTIPROCESSING=1 that builds `vllm.LLM` with
the engine arguments hubgym's offline engine passes for the model, then decodes 64 prompts x 256 tokens
(ignore_eos, seeded) three times after a warm-up, and shuts the engine down. "vllm" leaves the executor to vLLM,
whose CPU backend then starts the worker in a process of its own; "hubgym" passes the executor and the worker
extension hubgym passes (hubgym.engines.offline; the extension's import in the core's process freezes the
heap vLLM's start-up collections would walk, and lets that process leave without Python's teardown). Reported:
medians of the engine start (import of vLLM + `LLM(...)`), the decode time and tokens/s, the shutdown (until
the core's process has ended), the CPU seconds of the process and the processes it waited for, and hubgym /
vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r'''
import json, sys, time


def main(folder, layout, settings):
    started = time.time()
    import vllm
    from hubgym.engines.offline import _worker_in_core
    from hubgym.train.vllm_receiver import RECEIVER
    if layout == "hubgym":
        settings = {**settings, **_worker_in_core(settings), "worker_extension_cls": RECEIVER}
    llm = vllm.LLM(folder, **settings)
    built = time.time()
    params = vllm.SamplingParams(max_tokens=256, ignore_eos=True, seed=1)
    prompts = [f"Count from {i}:" for i in range(64)]
    llm.generate(prompts[:8], params, use_tqdm=False)
    decodes = []
    for _ in range(3):
        t = time.time()
        out = llm.generate(prompts, params, use_tqdm=False)
        decodes.append((time.time() - t, sum(len(o.outputs[0].token_ids) for o in out)))
    t = time.time()
    llm.llm_engine.engine_core.shutdown()  # returns once the core's process has ended (or was killed after 5 s)
    close = time.time() - t
    print("TIMES" + json.dumps({"start": built - started, "decodes": decodes, "close": close}))


if __name__ == "__main__":  # vLLM spawns its engine core: the script must not run again in it
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
'''


def measure(folder: str, layout: str, settings: dict) -> dict:
    """One fresh process: its phase times, wall time and the CPU seconds of it and of what it waited for."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(CHILD)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    done = subprocess.run([sys.executable, handle.name, folder, layout, json.dumps(settings)], capture_output=True,
                          text=True, env=env, timeout=1800)
    wall, after = time.time() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    os.unlink(handle.name)
    if done.returncode != 0 or "TIMES" not in done.stdout:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-3000:])
    times = json.loads(done.stdout.rsplit("TIMES", 1)[1].splitlines()[0])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    decode_s = statistics.median(s for s, _ in times["decodes"])
    tokens = times["decodes"][0][1]
    return {"start": times["start"], "decode": decode_s, "tokens_per_s": tokens / decode_s, "close": times["close"],
            "cpu": cpu, "wall": wall}


def engine_settings(folder: str) -> dict:
    """The LLM(...) arguments bench_startup.py passes for hubgym's offline engine (the executor, the side measured,
    left out), with enforce_eager."""
    from bench_startup import engine_settings as offline_engine_settings

    return {**offline_engine_settings(folder), "enforce_eager": True}


def bench_model(name: str, rounds: int) -> dict[str, list[dict]]:
    from hubgym.models import resolve_model

    folder = resolve_model(name, setting="--model")  # made or converted now, outside every measurement
    settings, sides = engine_settings(folder), {"vllm": [], "hubgym": []}
    for round_ in range(rounds):
        for layout in (["vllm", "hubgym"] if round_ % 2 == 0 else ["hubgym", "vllm"]):
            sides[layout].append(measure(folder, layout, settings))
            print(f"{name} round {round_ + 1} {layout}: {sides[layout][-1]}", file=sys.stderr)
    return sides


def table(name: str, sides: dict[str, list[dict]]) -> str:
    def med(layout: str, key: str) -> float:
        return statistics.median(row[key] for row in sides[layout])

    lines = [f"#### `--model {name}` ({len(sides['vllm'])} rounds, medians)", "",
             "| worker | engine start | decode 64 x 256 tokens | tokens/s | shutdown | CPU s of the process | "
             "process wall |",
             "|---|---|---|---|---|---|---|"]
    for layout, label in (("vllm", "its own process (vLLM's CPU layout)"), ("hubgym", "in the core's (hubgym)")):
        lines.append(f"| {label} | {med(layout, 'start'):.1f} s | {med(layout, 'decode'):.2f} s | "
                     f"{med(layout, 'tokens_per_s'):,.0f} | {med(layout, 'close'):.2f} s | {med(layout, 'cpu'):.1f} | "
                     f"{med(layout, 'wall'):.1f} s |")
    lines += ["", f"hubgym / vLLM: engine start **{med('hubgym', 'start') / med('vllm', 'start'):.2f}x** the time, "
              f"decode **{med('hubgym', 'tokens_per_s') / med('vllm', 'tokens_per_s'):.2f}x** the tokens/s, "
              f"shutdown **{med('hubgym', 'close') / med('vllm', 'close'):.2f}x** the time, "
              f"**{med('hubgym', 'cpu') / med('vllm', 'cpu'):.2f}x** the CPU seconds.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="tiny, smollm2-135m or a folder (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print, do not update bench/RESULTS.md")
    args = parser.parse_args(argv)
    body = "\n".join(table(name, bench_model(name, args.rounds)) for name in args.model or ["tiny"])
    print(body)
    if not args.no_write:
        from results import write_section

        header = (f"Measured with `python bench/bench_worker.py` on {platform.machine()} ({os.cpu_count()} cores, "
                  f"load average {os.getloadavg()[0]:.1f} when written), enforce_eager, each side a fresh process, "
                  f"the sides taking turns.\n\n")
        write_section("## vLLM on a CPU: the worker in the engine core's process", header + body)


if __name__ == "__main__":
    main()
