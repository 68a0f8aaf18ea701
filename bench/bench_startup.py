"""Time from command to first sampled token: `hubgym rollout` against vLLM's own start, in fresh processes.

    python bench/bench_startup.py                        # --model tiny and smollm2-135m, 3 rounds each
    python bench/bench_startup.py --model tiny --rounds 2 --no-write

Every measurement is a fresh Python process on one model folder (resolved, and the tiny model made or
SmolLM2 converted, before any round: neither is part of a start), the two sides taking turns each round
(raw first on odd rounds, hubgym first on even ones), since this machine's load drifts by tens of percent
within minutes:

- raw vLLM: import vllm, build `LLM(...)` with the settings hubgym's offline engine uses for this model
  (dtype float32, enforce_eager, the same max_model_len and KV cache), generate one token for one prompt;
- hubgym: the `hubgym rollout ENV --limit 1 --n 1 --max-tokens 1` command's own path, in phases: import
  the CLI, resolve the model, open the env and take its task, start the engine (`engine_for`), then the
  run (the first token, scored and written as a one-row shard, and the run manifest).

Reported per model: the median of each phase, the wall time of each process, and the ratio of hubgym's
time to its first token (everything before the run, plus the run) to raw vLLM's (import + LLM + generate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).parent
ENV = "arithmetic:easy"

RAW = r'''
import json, sys, time


def main(folder, started, settings):
    import vllm
    imported = time.time()
    llm = vllm.LLM(folder, **settings)
    built = time.time()
    llm.generate(["What is 2 + 3?"], vllm.SamplingParams(max_tokens=1), use_tqdm=False)
    done = time.time()
    print("TIMES" + json.dumps({"import": imported - started, "engine": built - imported, "generate": done - built}))


if __name__ == "__main__":  # vLLM spawns its engine core: the script must not run again in it
    main(sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3]))
'''

HUBGYM = r'''
import json, sys, time


def main(model_name, started, env, out):
    import hubgym.cli  # the command's own imports
    imported = time.time()
    from hubgym.models import context_length, resolve_model
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig
    from hubgym.rollout.run import engine_for, load_run_envs, run_rollouts
    model = resolve_model(model_name, setting="--model")
    config = RolloutConfig(envs=[env], model=model, out=out, n=1, limit=1, sampling=SamplingArgs(max_tokens=1),
                           max_model_len=context_length(model, None))
    resolved = time.time()
    load_run_envs(config)
    opened = time.time()
    engine = engine_for(config)
    built = time.time()
    run_rollouts(config, engine=engine, progress=False)
    done = time.time()
    print("TIMES" + json.dumps({"import": imported - started, "model": resolved - imported, "envs": opened - resolved,
                                "engine": built - opened, "run": done - built}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4])
'''


def timed(script: str, *args: str) -> tuple[dict[str, float], float]:
    """(phase seconds the child measured, its wall time from spawn to exit) of one fresh process."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(script)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}  # hubgym's default, both sides
    started = time.time()
    done = subprocess.run([sys.executable, handle.name, args[0], str(started), *args[1:]], capture_output=True,
                          text=True, env=env, timeout=1800)
    wall = time.time() - started
    os.unlink(handle.name)
    if done.returncode != 0 or "TIMES" not in done.stdout:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-3000:])
    return json.loads(done.stdout.rsplit("TIMES", 1)[1].splitlines()[0]), wall


def engine_settings(folder: str) -> dict:
    """The LLM(...) arguments hubgym's offline engine passes for this folder on this machine, less its own weight
    receiver (the in-memory weight sync, a hubgym addition: its cost is counted on hubgym's side)."""
    from hubgym.models import context_length
    from hubgym.engines import EngineSettings

    length = context_length(folder, None)
    return {"max_model_len": length, "seed": 0, "enable_prefix_caching": True, "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(8192, length), **EngineSettings().vllm_args()}


def bench_model(name: str, rounds: int) -> dict:
    from hubgym.models import resolve_model

    folder = resolve_model(name, setting="--model")  # made or converted now, outside every measurement
    settings = engine_settings(folder)
    raw, ours = [], []
    for round_ in range(rounds):
        order = ["raw", "hubgym"] if round_ % 2 == 0 else ["hubgym", "raw"]
        for side in order:
            if side == "raw":
                raw.append(timed(RAW, folder, json.dumps(settings)))
            else:
                with tempfile.TemporaryDirectory() as out:
                    ours.append(timed(HUBGYM, name, ENV, out))
    return {"model": name, "raw": raw, "hubgym": ours}


def median(rows: list[tuple[dict, float]], key: str | None) -> float:
    return statistics.median(r[1] if key is None else r[0][key] for r in rows)


def table(result: dict) -> str:
    raw, ours = result["raw"], result["hubgym"]
    raw_first = statistics.median(sum(r[0].values()) for r in raw)
    ours_first = statistics.median(sum(r[0].values()) for r in ours)
    lines = [f"#### `--model {result['model']}` ({len(raw)} rounds, medians)", "",
             "| side | import | model | env | engine | first token | to first token | process wall |",
             "|---|---|---|---|---|---|---|---|",
             f"| raw vLLM | {median(raw, 'import'):.1f} s | - | - | {median(raw, 'engine'):.1f} s | "
             f"{median(raw, 'generate'):.1f} s | {raw_first:.1f} s | {median(raw, None):.1f} s |",
             f"| hubgym rollout | {median(ours, 'import'):.1f} s | {median(ours, 'model'):.1f} s | "
             f"{median(ours, 'envs'):.1f} s | {median(ours, 'engine'):.1f} s | {median(ours, 'run'):.1f} s | "
             f"{ours_first:.1f} s | {median(ours, None):.1f} s |", "",
             f"hubgym / raw vLLM, command to first token: **{ours_first / raw_first:.2f}x**; hubgym's own share "
             f"(import of its CLI, model, env, run around the token): {ours_first - raw_first:+.1f} s.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="tiny, smollm2-135m or a folder (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print, do not update bench/RESULTS.md")
    args = parser.parse_args(argv)
    results = [bench_model(model, args.rounds) for model in args.model or ["tiny", "smollm2-135m"]]
    body = "\n".join(table(r) for r in results)
    print(body)
    if not args.no_write:
        from results import write_section

        load = os.getloadavg()[0]
        header = (f"Measured with `python bench/bench_startup.py` on {platform.machine()} ({os.cpu_count()} cores, "
                  f"load average {load:.1f} when written), each side a fresh process, the sides taking turns.\n\n")
        write_section("## Startup: command to first sampled token", header + body)


if __name__ == "__main__":
    main()
