"""What `hubgym view` holds in memory for a large run, against loading the run whole (what a page without an index
would need), measured side by side in child processes.

    python bench/bench_view.py                       # 40 shards x 1,000 rows; updates bench/RESULTS.md
    python bench/bench_view.py --shards 8 --rows 500 --no-write

The run: real wordle rollouts (six turns, about 540 token ids each) written by hubgym's rollout loop with the tiny
model's tokenizer against the instant server, copied under new rollout ids into `--shards` shards of `--rows` rows by
hubgym's shard writer (sha256 recorded in the manifest, as a real run has). Each side runs in its own process:

- view: `RunStore.open` (every shard read once and checked, its small columns kept), then 200 rows opened at random
  (each read from its shard; the last two shards kept), as pages ask for them;
- whole: every shard read into one Arrow table (`iter_batches`, the same checks), then the same 200 rows taken from it.

Both sides run twice: on the run folder, and on the run pushed to the loopback Hub-API server (read over HTTP).

Reported per side: seconds to be ready, seconds for the 200 rows,
the memory the side's data holds and its resident memory, and (view) the index's own size per row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the loopback Hub-API server of the test suite (tests/helpers/hub_server.py)
from results import write_section  # noqa: E402  (bench/ is on sys.path when run as a script)

HEADING = "## hubgym view: the index of a large run vs the run in memory"
OPENED = 200


def make_run(root: Path, shards: int, rows: int) -> Path:
    """A real small wordle run, its rows copied under new ids into `shards` x `rows` rows."""
    from hubgym.hub.rollout_reader import iter_rollouts
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts
    from hubgym.rollout.instant_server import InstantServer
    from hubgym.models.tiny import make_tiny_model
    from hubgym.rollout.writer import ShardWriter, worker_name

    model = make_tiny_model(root / "tiny-model")
    small = root / "small"
    with InstantServer(model, log_path=root / "instant.log") as server:
        run_rollouts(RolloutConfig(envs=["wordle"], model=str(model), out=str(small), engine="openai",
                                   base_url=server.url("wordle"), n=4, limit=8, sampling=SamplingArgs(max_tokens=48),
                                   max_model_len=2048), progress=False)
    seed_rows = list(iter_rollouts(small))
    big = root / "big"
    with ShardWriter(big, worker_name(0, 1), max_rows=rows, run_id="bench-view") as writer:
        for g in range(shards * rows // len(seed_rows)):
            group = [dict(r, rollout_id=f"{r['rollout_id']}-copy{g}", group=f"{r['group']}-copy{g}",
                          task_id=f"{r['task_id']}-copy{g // 8}") for r in seed_rows]
            writer.add_group(group)
        writer.flush()
        writer.write_manifest({"run_id": "bench-view", "envs": {}, "shard_files": writer.shard_files()})
    return big


def rss_mb() -> float:
    """Anonymous resident memory (RSS less file-backed and shared pages): what the process itself allocated. Local
    shards are memory-mapped, so their pages, once read (hashed), are resident but belong to the page cache."""
    import psutil

    info = psutil.Process().memory_info()
    return (info.rss - info.shared) / 2**20


def side_view(run: str, hub: str | None) -> dict:
    from hubgym.viewer import RunStore

    base = rss_mb()
    started = time.perf_counter()
    store = RunStore.open([run], hub=hub)
    ready = time.perf_counter() - started
    ids = store.runs[0].index["rollout_id"].to_list()
    picks = random.Random(0).sample(ids, OPENED)
    started = time.perf_counter()
    opened = sum(len(store.row(0, i)["completion_ids"]) for i in picks)
    rows_s = time.perf_counter() - started
    held = store.runs[0].index.estimated_size() + sum(t.nbytes for t in store._open.values())
    return {"rows": len(ids), "ready_s": ready, "open_s": rows_s, "rss_mb": rss_mb() - base, "held_mb": held / 2**20,
            "tokens": opened, "index_bytes_per_row": store.runs[0].index.estimated_size() / len(ids)}


def side_whole(run: str, hub: str | None) -> dict:
    import pyarrow as pa
    import pyarrow.compute as pc

    from hubgym.hub.rollout_reader import iter_batches

    base = rss_mb()
    started = time.perf_counter()
    table = pa.Table.from_batches(list(iter_batches(run, hub=hub)))
    ready = time.perf_counter() - started
    ids = table.column("rollout_id").to_pylist()
    picks = random.Random(0).sample(ids, OPENED)
    started = time.perf_counter()
    opened = 0
    for i in picks:
        row = table.filter(pc.equal(table.column("rollout_id"), i)).to_pylist()[0]
        opened += len(row["completion_ids"])
    rows_s = time.perf_counter() - started
    return {"rows": len(ids), "ready_s": ready, "open_s": rows_s, "rss_mb": rss_mb() - base,
            "held_mb": table.nbytes / 2**20, "tokens": opened, "index_bytes_per_row": None}


def run_side(side: str, run: str, hub: str | None) -> dict:
    command = [sys.executable, __file__, "--side", side, "--run", run] + (["--hub", hub] if hub else [])
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(repeats: int, sources: dict[str, tuple[str, str | None]]) -> dict[tuple[str, str], dict]:
    """Each (source, side) `repeats` times, the sides taking turns; the median of each number."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(repeats):
        for source, (where, hub) in sources.items():
            for side in ("view", "whole"):
                runs.setdefault((source, side), []).append(run_side(side, where, hub))
    return {key: {k: statistics.median(r[k] for r in rs) if rs[0][k] is not None else None for k in rs[0]}
            for key, rs in runs.items()}


def start_hub(root: Path):
    """The loopback Hub-API server, in a thread here (the sides read it over HTTP); huggingface_hub reads these
    variables at import, so this runs before anything imports it."""
    from helpers.hub_server import HubServer

    server = HubServer(root / "server").start()
    os.environ.update(HF_ENDPOINT=server.url, HF_HUB_DISABLE_XET="1", HF_HUB_OFFLINE="0", HF_HOME=str(root / "hf"),
                      HF_HUB_DISABLE_TELEMETRY="1")
    return server


def push(run: Path, root: Path, url: str) -> str:
    from hubgym.hub import HfHub
    from hubgym.hub.rollouts import push_rollouts

    return push_rollouts(run, "org/rollouts", hub=HfHub(endpoint=url, cache_dir=root / "push"), name="big").ref


def report(args, results: dict[tuple[str, str], dict], run_mb: float, load: float) -> str:
    view = results[("local", "view")]
    lines = [f"Measured {time.strftime('%Y-%m-%d')} with `python bench/bench_view.py --shards {args.shards} --rows "
             f"{args.rows} --repeats {args.repeats}` on {platform.machine()} ({os.cpu_count()} cores, no GPU), load "
             f"average {load:.2f} at start. The run: {view['rows']:,} wordle rollouts in {args.shards} shards "
             f"({run_mb:,.0f} MB of Arrow files), real rows of hubgym's rollout loop (tiny model's tokenizer, "
             f"instant server) copied under new ids. Each side in its own process, the sides taking turns, medians "
             f"of {args.repeats} runs. Held: the bytes the side's data structures reference at the end (view: its "
             f"index and the two shards kept; whole: the table); anonymous RSS: the process's resident memory less "
             f"file-backed pages (local shards are memory-mapped: their pages belong to the page cache), at the end "
             f"minus after imports.", "",
             "| source | side | ready (s) | 200 rows opened (s) | held (MB) | anonymous RSS (MB) | index bytes / row |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    names = {"view": "hubgym view (index + rows from shards)", "whole": "the run loaded whole"}
    for (source, side), r in results.items():
        per_row = f"{r['index_bytes_per_row']:.0f}" if r["index_bytes_per_row"] else "-"
        lines.append(f"| {source} | {names[side]} | {r['ready_s']:.2f} | {r['open_s']:.2f} | {r['held_mb']:,.1f} | "
                     f"{r['rss_mb']:,.0f} | {per_row} |")
    lines.append("")
    for source in ("local", "hub"):
        v, w = results[(source, "view")], results[(source, "whole")]
        lines.append(f"- {source}, view / whole: held memory {v['held_mb'] / max(w['held_mb'], 1e-9):.3f}x, "
                     f"anonymous RSS {v['rss_mb'] / max(w['rss_mb'], 1e-9):.2f}x, ready time "
                     f"{v['ready_s'] / w['ready_s']:.2f}x, 200 random rows {v['open_s'] / w['open_s']:.2f}x.")
    lines += ["", "The local run's shards are memory-mapped, so loading it whole costs page cache, not the "
              "process's own memory; a hub run's shards are fetched into memory (the loopback Hub-API server of "
              "tests/helpers/hub_server.py, in a thread of the benchmark's process, over HTTP). "
              "Both sides read every shard "
              "once with the same checks (sha256 against the manifest); the view keeps the "
              "small columns of each shard and drops the rest, so its memory grows with the row count "
              "(the index), not with the tokens and messages. Opening a row reads its shard again (two kept): "
              "random rows over many shards cost a shard read each, pages in shard order one read per shard.",
              "", "Tried and not adopted: keeping every shard's Arrow table open (memory-mapped, a local run only) "
              "would make row opens free, but a hub run's shards are fetched into memory, so the view keeps two.",
              "", "Reproduce: `python bench/bench_view.py [--shards N --rows R]` (needs the cpu extra: the instant "
              "server tokenizes with the tiny model's tokenizer)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=40)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, taking turns (medians)")
    parser.add_argument("--no-write", action="store_true", help="print, do not update bench/RESULTS.md")
    parser.add_argument("--side", choices=["view", "whole"], help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--hub", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        import hubgym.hub.rollout_reader  # noqa: F401
        import hubgym.viewer  # noqa: F401  (imports before the baseline, on both sides)

        print(json.dumps((side_view if args.side == "view" else side_whole)(args.run, args.hub)))
        return
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        server = start_hub(Path(tmp))
        try:
            run = make_run(Path(tmp), args.shards, args.rows)
            run_mb = sum(p.stat().st_size for p in (run / "shards").glob("*.arrow")) / 2**20
            ref = push(run, Path(tmp), server.url)
            results = measure(args.repeats, {"local": (str(run), None), "hub": (ref, server.url)})
        finally:
            server.stop()
    body = report(args, results, run_mb, load)
    print(body)
    if not args.no_write:
        write_section(HEADING, body)


if __name__ == "__main__":
    main()
