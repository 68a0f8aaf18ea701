"""Benchmark streaming a rollout repo from a Hub-API server: time to first row and sustained rows/s.

    python bench/bench_stream.py                          # updates bench/RESULTS.md
    python bench/bench_stream.py --rows 5000 --no-write
    python bench/bench_stream.py --seed-run runs/r1       # replicate the rows of an existing run (no vLLM)

Rows: a small real run (vLLM, the tiny local model, arithmetic:easy, 8 tasks x 4 samples, up to 64
tokens a reply: real token ids, logprobs, masks, scores and provenance) is replicated to `--rows` rows
(new rollout ids and groups, everything else as sampled) and written by hubgym's ShardWriter, then
pushed with `push_rollouts` to the loopback Hub-API server of the test suite (tests/helpers/hub_server.py),
started by this script on 127.0.0.1 in a child process (`--server thread`: in this process). Side by
side in one run, each reader from cold caches `--repeats` times (the readers take turns in every round),
medians reported. The clock starts
before the source is opened; each reader first reads one row untimed, so one-time imports are left
out (the first `datasets.IterableDataset` of a process imports torch: 3-5 s here).

- hub, hubgym `iter_batches` / `iter_rollouts`: reads the run's index.json, then streams the shards
  (one GET each, the next fetched while the current one is read), each checked against its sha256;
- hub, hubgym `open_rollouts`: the same reading as a `datasets.IterableDataset`;
- hub, plain `datasets.load_dataset(REPO, RUN, streaming=True)`: the card's YAML, no verification;
- local folder: the same shards on disk, read by hubgym (`iter_batches`, `iter_rollouts`) and by
  `datasets.load_dataset("arrow", data_files=..., streaming=True)`;
- "checks off": hubgym's `iter_batches` and `iter_rollouts` with the per-batch checks of
  hubgym.hub.shard_checks switched off (bench/unchecked.py): the reading as it was before every batch of
  every shard was fully validated, side by side with it (the sha256 is checked either way).

"sustained rows/s" counts the rows after the first, over the time after the first row.
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
from typing import Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from results import write_section  # noqa: E402  (bench/ is on sys.path when run as a script)
HEADING = "## Streaming rollouts from a Hub"


def timed(open_rows: Callable[[], Iterable], count: Callable[[object], int]) -> tuple[float, float, int]:
    """(seconds to the first row, sustained rows/s after it, rows), opening the source included."""
    started = time.perf_counter()
    first_at, first_rows, rows = None, 0, 0
    for item in open_rows():
        rows += count(item)
        if first_at is None:
            first_at, first_rows = time.perf_counter() - started, rows
    total = time.perf_counter() - started
    return first_at or 0.0, (rows - first_rows) / max(total - (first_at or 0.0), 1e-9), rows


def seed_rows(seed_run: Path | None, tmp: Path) -> list[dict]:
    """The real rows to replicate: from `seed_run`, or from a small vLLM run made now."""
    from hubgym.hub.rollouts import iter_rollouts

    if seed_run is None:
        from hubgym.engines import SamplingArgs, VLLMEngine
        from hubgym.rollout import RolloutConfig, run_rollouts
        from hubgym.models.tiny import make_tiny_model

        seed_run, model = tmp / "seed-run", str(make_tiny_model(tmp / "tiny-model"))
        engine = VLLMEngine(model, max_model_len=512)
        run_rollouts(RolloutConfig(envs=["arithmetic:easy"], model=model, out=str(seed_run), n=4, limit=8,
                                   sampling=SamplingArgs(max_tokens=64), max_model_len=512), engine, progress=False)
        engine.close()  # its engine process would share the cores with the reads
    return list(iter_rollouts(seed_run))


def replicate(rows: list[dict], total: int, out: Path, per_shard: int) -> Path:
    """`total` rows: copies of `rows` with new rollout ids and groups, written by the ShardWriter."""
    from hubgym.rollout.writer import ShardWriter

    writer = ShardWriter(out, "w000of001", max_rows=per_shard)
    copies = -(-total // len(rows))
    for k in range(copies):
        groups: dict[str, list[dict]] = {}
        for row in rows:
            groups.setdefault(row["group"], []).append(
                {**row, "rollout_id": f"{row['rollout_id']}-c{k}", "group": f"{row['group']}-c{k}"})
        for group in groups.values():
            writer.add_group(group)
    writer.flush()
    writer.write_manifest({"run_id": "bench", "model": rows[0]["provenance"]["model"], "sampling": {},
                           "envs": {}, "shard_files": writer.shard_files()})
    return out


def serve(root: Path, urls, stop) -> None:
    """The loopback Hub-API server in a child process (`--server process`): it runs until `stop` is set."""
    from helpers.hub_server import HubServer

    server = HubServer(root).start()
    urls.put(server.url)
    stop.wait()
    server.stop()


def start_server(where: str, root: Path) -> tuple[str, Callable[[], None]]:
    """(its URL, how to stop it), the server in this process (threads) or in a child process."""
    if where == "thread":
        from helpers.hub_server import HubServer

        server = HubServer(root).start()
        return server.url, server.stop
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=serve, args=(root, urls, stop), daemon=True)
    child.start()

    def halt() -> None:
        stop.set()
        child.join(10)
    return urls.get(timeout=120), halt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000, help="rollouts in the benchmarked run")
    parser.add_argument("--per-shard", type=int, default=1000, help="rows per shard")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed-run", type=Path, help="run folder whose rows are replicated [default: a vLLM run]")
    parser.add_argument("--server", choices=["process", "thread"], default="process",
                        help="run the loopback Hub server in a child process (as a remote Hub is) or in a thread of "
                             "this one (it then shares this process's GIL with the reader)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hubgym-bench-stream-"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    url, stop_server = start_server(args.server, tmp / "server")
    # huggingface_hub and datasets read these at import: set them before anything imports them
    os.environ.update(HF_ENDPOINT=url, HF_HUB_DISABLE_XET="1", HF_HUB_OFFLINE="0", HF_HOME=str(tmp / "hf"),
                      HF_HUB_DISABLE_TELEMETRY="1", HF_DATASETS_OFFLINE="0")
    rows = seed_rows(args.seed_run, tmp)
    import datasets
    from rich.console import Console
    from rich.table import Table

    from hubgym.hub import HfHub
    from hubgym.hub.rollouts import iter_batches, iter_rollouts, open_rollouts, push_rollouts

    datasets.disable_progress_bars()
    run = replicate(rows, args.rows, tmp / "run", args.per_shard)
    pushed = push_rollouts(run, "org/rollouts", hub=HfHub(endpoint=url, cache_dir=tmp / "push"), name="run")
    shards = sorted((run / "shards").glob("*.arrow"))
    size = sum(p.stat().st_size for p in shards)

    def hub(i: int, name: str) -> HfHub:
        return HfHub(endpoint=url, cache_dir=tmp / f"{name}-{i}")

    from unchecked import checks_off

    def unchecked(read):
        """A reader run with the checks off, for all of its rows (a generator: the switch stays on while it runs)."""
        def rows(i: int):
            with checks_off():
                yield from read(i)
        return rows

    one, batch_rows = (lambda _: 1), (lambda b: b.num_rows)
    readers = {
        "hub · hubgym iter_batches": (lambda i: iter_batches(pushed.ref, hub=hub(i, "b")), batch_rows),
        "hub · hubgym iter_batches, checks off": (unchecked(lambda i: iter_batches(pushed.ref, hub=hub(i, "B"))),
                                                  batch_rows),
        "hub · hubgym iter_rollouts": (lambda i: iter_rollouts(pushed.ref, hub=hub(i, "r")), one),
        "hub · hubgym iter_rollouts, checks off": (unchecked(lambda i: iter_rollouts(pushed.ref, hub=hub(i, "R"))),
                                                   one),
        "hub · hubgym open_rollouts (datasets)": (lambda i: open_rollouts(pushed.ref, hub=hub(i, "o")), one),
        "hub · datasets load_dataset(REPO, RUN)": (lambda i: datasets.load_dataset(
            "org/rollouts", "run", split="train", streaming=True, cache_dir=str(tmp / f"ds-{i}")), one),
        "local · hubgym iter_batches": (lambda i: iter_batches(run), batch_rows),
        "local · hubgym iter_batches, checks off": (unchecked(lambda i: iter_batches(run)), batch_rows),
        "local · hubgym iter_rollouts": (lambda i: iter_rollouts(run), one),
        "local · hubgym iter_rollouts, checks off": (unchecked(lambda i: iter_rollouts(run)), one),
        "local · datasets load_dataset(arrow)": (lambda i: datasets.load_dataset(
            "arrow", data_files=[str(p) for p in shards], split="train", streaming=True,
            cache_dir=str(tmp / f"dl-{i}")), one),
    }
    for make, _ in readers.values():  # untimed: one-time imports (a datasets IterableDataset imports torch)
        next(iter(make(-1)))
    load_before = os.getloadavg()
    results: dict[str, list] = {name: [] for name in readers}
    for i in range(args.repeats):  # the readers take turns: the machine's load drifts, and turns move them together
        for name, (make, count) in readers.items():
            results[name].append(timed(lambda: make(i), count))
    load_after = os.getloadavg()
    stop_server()

    table = Table("source · reader", "rows", "time to first row (s)", "sustained rows/s",
                  title=f"streaming {pushed.rows:,} rollouts ({len(shards)} shards, {size / 2**20:.1f} MiB)")
    for name, runs in results.items():
        assert all(r[2] == pushed.rows for r in runs), (name, runs)
        table.add_row(name, f"{runs[0][2]:,}", f"{statistics.median(r[0] for r in runs):.3f}",
                      f"{statistics.median(r[1] for r in runs):,.0f}")
    console = Console(width=140, record=True)
    console.print(table)
    recorded = console.export_text()
    load = f"load average (1 min) {load_before[0]:.2f} before the reads, {load_after[0]:.2f} after"
    console.print(load)
    if not args.no_write:
        write_results(recorded, args, len(rows), load)


def write_results(text: str, args: argparse.Namespace, seed_rows_count: int, load: str) -> None:
    flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in [("rows", args.rows), ("per_shard", args.per_shard),
                                                                  ("server", args.server)]
                    if v != {"rows": 20_000, "per_shard": 1000, "server": "process"}[k])
    server = ("in a child process of the benchmark" if args.server == "process" else
              "in a thread of the benchmark's process (sharing its CPU and GIL with the reader)")
    body = (f"Measured {dt.date.today()} with `python bench/bench_stream.py{flags}` on "
            f"{platform.machine()} ({os.cpu_count()} cores); {load} (`uptime`). Rows: {seed_rows_count} real rollouts "
            f"(vLLM, the tiny local model, arithmetic:easy, up to 64 tokens a reply) replicated to {args.rows:,} with "
            f"new ids, {args.per_shard} a shard. The loopback Hub-API server (tests/helpers/hub_server.py) "
            f"runs {server} on "
            f"127.0.0.1. Medians of {args.repeats} reads from cold caches, after one untimed row per reader.\n\n```\n"
            f"{text}```\n\nThe hubgym readers check each shard whole against its sha256 before handing out any of "
            f"its rows, so their time to first row is one shard's transfer; `datasets` starts on a shard's first "
            f"bytes and checks nothing. `open_rollouts` is hubgym's verified reading behind the `datasets` API "
            f"(datasets calls it once per shard, so it runs without `iter_batches`' prefetch of the next shard). "
            f"\"checks off\" is the same reader with the per-batch checks of hubgym.hub.shard_checks switched off "
            f"(bench/unchecked.py: full Arrow validation, the writer's rules, rollout ids across shards): the "
            f"reading as it was before they ran on every shard, measured in turn with it.\n\n")
    write_section(HEADING, body)


if __name__ == "__main__":
    main()
