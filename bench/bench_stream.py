"""Benchmark streaming a rollout repo from a Hub-API server: time to first row and sustained rows/s.

    python bench/bench_stream.py                 # updates bench/RESULTS.md
    python bench/bench_stream.py --groups 500 --no-write

The loopback Hub-API server of the test suite (tests/hub_server.py) runs in this process on
127.0.0.1; a run of scored arithmetic rollouts (the test suite's rows: real verifier scores,
synthetic token ids) is pushed to it with `push_rollouts`. Then, side by side in one run:

- hubgym reader: `iter_rollout_rows(["org/rollouts@rev:run"])` through the real huggingface_hub
  client (it fetches the run's files into the snapshot cache, checks each shard's sha256, then
  reads record batch by record batch);
- datasets streaming: `load_dataset("arrow", data_files=<resolve URLs>, streaming=True)`, rows read
  over HTTP as they arrive;
- local folder: `iter_rollout_rows([run_dir])`, the same shards on disk (the floor).

Each reader runs 3 times from a cold cache (fresh cache folders); medians are reported. The clock
starts before the source is opened (resolving the revision and the file list included).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
RESULTS = Path(__file__).with_name("RESULTS.md")
HEADING = "## Streaming rollouts from a Hub"


def timed(open_rows) -> tuple[float, float, int]:
    """(seconds to the first row, seconds to the last, rows), opening the source included."""
    started = time.perf_counter()
    first, count = None, 0
    for _ in open_rows():
        count += 1
        if first is None:
            first = time.perf_counter() - started
    return first or 0.0, time.perf_counter() - started, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=2500, help="groups of 2 rollouts in the run")
    parser.add_argument("--per-shard", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="hubgym-bench-stream-"))

    from hub_server import HubServer

    server = HubServer(tmp / "server").start()
    os.environ.update(HF_ENDPOINT=server.url, HF_HUB_DISABLE_XET="1", HF_HUB_OFFLINE="0", HF_HOME=str(tmp / "hf"),
                      HF_HUB_DISABLE_TELEMETRY="1")
    import datasets
    from rich.console import Console
    from rich.table import Table
    from test_hub_rollouts import make_run

    from hubgym.hub import HfHub
    from hubgym.hub.rollouts import iter_rollout_rows, push_rollouts

    datasets.disable_progress_bars()
    run = make_run(tmp / "run", "run", groups=args.groups, per_shard=args.per_shard)
    pushed = push_rollouts(run, "org/rollouts", hub=HfHub(endpoint=server.url, cache_dir=tmp / "push"))
    shards = sorted((run / "shards").glob("*.arrow"))
    size = sum(p.stat().st_size for p in shards)

    def hubgym_reader(i: int):
        return iter_rollout_rows([pushed.ref], hub=HfHub(endpoint=server.url, cache_dir=tmp / f"hubgym-{i}"))

    def datasets_reader(i: int):
        hub = HfHub(endpoint=server.url, cache_dir=tmp / f"meta-{i}")
        snapshot = hub.resolve("org/rollouts", pushed.revision, patterns=["README.md"])
        urls, kwargs = hub.stream_urls(snapshot, [f"run/shards/{p.name}" for p in shards])
        return datasets.load_dataset("arrow", data_files=urls, split="train", streaming=True,
                                     cache_dir=str(tmp / f"ds-{i}"), **kwargs)

    readers = {"hubgym reader (hub)": hubgym_reader, "datasets streaming (hub)": datasets_reader,
               "local folder": lambda i: iter_rollout_rows([run])}
    results = {name: [timed(lambda: make(i)) for i in range(args.repeats)] for name, make in readers.items()}
    server.stop()

    table = Table("reader", "rows", "time to first row (s)", "total (s)", "rows/s",
                  title=f"streaming {pushed.rows:,} rollouts ({len(shards)} shards, {size / 2**20:.1f} MiB)")
    for name, runs in results.items():
        first = statistics.median(r[0] for r in runs)
        total = statistics.median(r[1] for r in runs)
        table.add_row(name, f"{runs[0][2]:,}", f"{first:.3f}", f"{total:.2f}", f"{runs[0][2] / total:,.0f}")
    console = Console(width=140, record=True)
    console.print(table)
    if not args.no_write:
        body = (f"{HEADING}\n\nMeasured {dt.date.today()} with `python bench/bench_stream.py` on {platform.machine()} "
                f"({os.cpu_count()} cores), load average {load[0]:.2f} at start; the loopback Hub-API server runs in the "
                f"same process (so HTTP costs CPU on both ends), medians of {args.repeats} cold-cache reads.\n\n```\n"
                f"{console.export_text()}```\n\nhubgym's reader fetches the run's files (and checks each shard's sha256) "
                f"before its first row, so its time to first row grows with the run; `datasets` streaming yields rows "
                f"as bytes arrive. Both read the same shards pushed by `push_rollouts`.\n")
        text = RESULTS.read_text()
        if HEADING in text:
            start = text.index(HEADING)
            end = text.find("\n## ", start + len(HEADING))
            text = text[:start] + body + (text[end + 1:] if end >= 0 else "")
        else:
            text = text.rstrip() + "\n\n" + body
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
