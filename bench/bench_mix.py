"""Benchmark the task mixture: peak memory and time to the first batch as env configs and rows grow, the lazy
mixture beside the eager path (every env's split built and loaded whole, as `hubgym.load_env` does), plus the
throughput of drawing a million tasks.

    python bench/bench_mix.py                              # the full grid: 10/100/1,000 env configs x 10k/100k/1M rows
    python bench/bench_mix.py --envs 10 100 --rows 10000 --eager-max-envs 100 --throughput 0

The env configs are real: N configs of the built-in `arithmetic:hard` env (three operands up to 999, + - *),
each with its own seed (seed = 0..N-1) and a train split of rows/N tasks, written as a mixture spec of N
entries `{name: arithmetic:hard, seed: i, size: rows/N}`. Every point runs in a fresh Python process:
- lazy: `Mixture.from_spec` (listing included) and its first `take(64)`, then `--batches` more batches;
- eager: each config's split built with datasets (a temporary cache per config, as `hubgym.load_env` builds
  it) and loaded as a list of rows, then a first batch of 64 drawn from those lists by weight.
Time to first batch is wall time from the start of that work (imports excluded, as both pay them); peak RSS is
`resource.getrusage(RUSAGE_SELF).ru_maxrss` of the process at its end; `base` is the RSS after imports.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time

BATCH = 64


def spec_of(envs: int, rows: int) -> dict:
    size = max(rows // envs, 1)
    return {"envs": [{"name": "arithmetic:hard", "seed": seed, "size": size} for seed in range(envs)]}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def lazy_point(envs: int, rows: int, batches: int) -> dict:
    from hubgym.mixture import Mixture, parse_spec

    base = rss_mb()
    started = time.perf_counter()
    mixture = Mixture.from_spec(parse_spec(spec_of(envs, rows)), split="train", seed=0)
    first = mixture.take(BATCH)
    first_s = time.perf_counter() - started
    for _ in range(batches):
        mixture.take(BATCH)
    return {"first_batch_s": first_s, "peak_rss_mb": rss_mb(), "base_rss_mb": base, "tasks": len(first),
            "open_sources": mixture.pool.most_open}


def eager_point(envs: int, rows: int) -> dict:
    import tempfile

    from hubgym.builders.arithmetic import Arithmetic

    base = rss_mb()
    started = time.perf_counter()
    size = max(rows // envs, 1)
    loaded = []
    with tempfile.TemporaryDirectory() as cache:
        for seed in range(envs):  # what hubgym.load_env does for each spec: build the split, then list its rows
            builder = Arithmetic(config_name="hard", cache_dir=f"{cache}/{seed}", dataset_name="arithmetic",
                                 seed=seed, sizes={"train": size})
            builder.download_and_prepare(download_mode="force_redownload", verification_mode="no_checks")
            split = builder.as_dataset()["train"]
            loaded.append([split[i] for i in range(len(split))])
        rng = random.Random("0:0")  # OnlineProducer.pick's draw before the mixture: env by weight, then a row
        chosen = rng.choices(range(envs), k=BATCH)
        first = [loaded[e][rng.randrange(len(loaded[e]))] for e in chosen]
        first_s = time.perf_counter() - started
        return {"first_batch_s": first_s, "peak_rss_mb": rss_mb(), "base_rss_mb": base, "tasks": len(first)}


def throughput(envs: int, rows: int, max_open: int) -> dict:
    from hubgym.mixture import Mixture, parse_spec

    mixture = Mixture.from_spec(parse_spec(spec_of(envs, rows)), split="train", seed=0, max_open=max_open)
    started, drawn = time.perf_counter(), 0
    while drawn < rows:
        drawn += len(mixture.take(BATCH))
    seconds = time.perf_counter() - started
    return {"tasks": drawn, "seconds": seconds, "tasks_per_s": drawn / seconds, "peak_rss_mb": rss_mb(),
            "opens": mixture.pool.opens}


def child(args: argparse.Namespace) -> None:
    import hubgym.mixture  # noqa: F401 - imports before the clock, for both paths
    import hubgym.builders.arithmetic  # noqa: F401
    import datasets  # noqa: F401

    if args.child == "lazy":
        result = lazy_point(args.point[0], args.point[1], args.batches)
    elif args.child == "eager":
        result = eager_point(args.point[0], args.point[1])
    else:
        result = throughput(args.point[0], args.point[1], args.batches)  # --batches carries max_open here
    print(json.dumps(result))


def run_child(kind: str, envs: int, rows: int, batches: int, timeout: float) -> dict | None:
    command = [sys.executable, __file__, "--child", kind, "--point", str(envs), str(rows), "--batches", str(batches)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as exc:
        print(exc.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--batches", type=int, default=100, help="lazy: batches drawn after the first (steady RSS)")
    parser.add_argument("--eager-max-envs", type=int, default=100, help="eager side only up to this many configs")
    parser.add_argument("--eager-max-rows", type=int, default=100_000, help="eager side only up to this many rows")
    parser.add_argument("--throughput", type=int, default=1_000_000, help="tasks drawn for the throughput line "
                        "(1,000 env configs); 0 skips it")
    parser.add_argument("--throughput-max-open", type=int, nargs="+", default=[1024, 256],
                        help="LRU bounds the throughput line runs with (1,024 holds every config open)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per point")
    parser.add_argument("--child", choices=["lazy", "eager", "throughput"], help=argparse.SUPPRESS)
    parser.add_argument("--point", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    print("| env configs | rows | lazy first batch (s) | lazy peak RSS (MB) | eager first batch (s) | "
          "eager peak RSS (MB) | RSS after imports (MB) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for envs in args.envs:
        for rows in args.rows:
            lazy = run_child("lazy", envs, rows, args.batches, args.timeout)
            feasible = envs <= args.eager_max_envs and rows <= args.eager_max_rows
            eager = run_child("eager", envs, rows, 0, args.timeout) if feasible else None
            cells = [f"{lazy['first_batch_s']:.2f}", f"{lazy['peak_rss_mb']:.0f}"] if lazy else ["-", "-"]
            cells += [f"{eager['first_batch_s']:.2f}", f"{eager['peak_rss_mb']:.0f}"] if eager else [
                "not run" if not feasible else "timed out", "-"]
            print(f"| {envs:,} | {rows:,} | {' | '.join(cells)} | {lazy['base_rss_mb'] if lazy else 0:.0f} |",
                  flush=True)
    for max_open in args.throughput_max_open if args.throughput else []:
        result = run_child("throughput", 1000, args.throughput, max_open, args.timeout)
        if result:
            print(f"\nthroughput, max_open={max_open}: {result['tasks']:,} tasks from 1,000 env configs in "
                  f"{result['seconds']:.1f} s = {result['tasks_per_s']:,.0f} tasks/s (peak RSS "
                  f"{result['peak_rss_mb']:.0f} MB, {result['opens']:,} source opens)", flush=True)
        else:
            print(f"\nthroughput, max_open={max_open}: did not finish in {args.timeout:.0f} s", flush=True)


if __name__ == "__main__":
    main()
