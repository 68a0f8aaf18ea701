"""Benchmark what the row contract costs a shard's read and write, side by side with the same work without it.

    python bench/bench_contract.py                    # prints the table (paste it into bench/RESULTS.md)
    python bench/bench_contract.py --rows 512 --prompt 256 --completion 512 --rounds 7

A shard of `--rows` rows (the writer's default bound, 512) with `--prompt` prompt ids and `--completion` completion
ids, mask and logprobs a row (random ids below 32,000, logprobs in [-10, 0]) is written by hubgym's ShardWriter
and read by `load_shard`, each side `--rounds` times, the sides taking turns in every round. Each side is timed in
CPU seconds of this process (`time.process_time`, every thread): on a machine other jobs load, the wall clock
mostly measures the wait for a core; medians and the fastest round are both shown.

- read, every check: sha256, structure, schema, full Arrow validation, the writer's rules and the row contract
  (what every reader does);
- read, no row contract: the same with the contract's rules (hubgym.schemas.row_contract) left out;
- read, unchecked: sha256, structure, schema and rows only (bench/unchecked.py: how readers read before every
  batch was checked);
- write, checked and unchecked: ShardWriter.write_shard with and without `check_rows`.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: unchecked.py


def make_rows(count: int, prompt: int, completion: int, seed: int = 0) -> list[dict]:
    import datetime as dt

    rng = random.Random(seed)
    rows = []
    for i in range(count):
        group, sample = divmod(i, 8)
        rows.append({
            "rollout_id": f"r-{group}-{sample}", "run_id": "r", "task_id": f"t{group}", "env": "arithmetic",
            "group": f"r-{group}", "sample": sample,
            "prompt": [{"role": "user", "content": "What is 2 + 2?", "tool_calls": None, "tool_call_id": None,
                        "name": None}],
            "completion": [{"role": "assistant", "content": "4", "tool_calls": None, "tool_call_id": None,
                            "name": None, "reasoning": None}],
            "info": {"answer": "4"},
            "interaction": {"kind": "single_turn", "max_turns": 1, "max_tokens": None, "tools": [],
                            "tool_rewards": []},
            "prompt_ids": [rng.randrange(32_000) for _ in range(prompt)],
            "completion_ids": [rng.randrange(32_000) for _ in range(completion)],
            "completion_mask": [1] * completion, "completion_logprobs": [-10 * rng.random() for _ in range(completion)],
            "tokens_consistent": True, "reward": float(sample % 2), "metrics": [{"name": "reward/correct",
                                                                                 "value": float(sample % 2)}],
            "finish_reason": "stop", "truncated": False, "num_turns": 1, "error": None,
            "provenance": {"model": "m", "policy_version": 0, "sampling": "{}", "env_repo": None, "env_revision": None,
                           "verifier_module": "v", "verifier_sha256": "0", "engine": "vllm", "engine_version": "0",
                           "chat_template_sha256": None, "env_code_sha256": None},
            "timings": {"generate_s": 0.1, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.1},
            "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})
    return rows


@contextmanager
def contract_off() -> Iterator[None]:
    """The row contract's rules skipped (the shard's other checks kept), in this process."""
    from hubgym.hub import shard_checks

    saved = shard_checks.first_breach, shard_checks.group_breach
    shard_checks.first_breach = lambda batch, **kwargs: None
    shard_checks.group_breach = lambda table: None
    try:
        yield
    finally:
        shard_checks.first_breach, shard_checks.group_breach = saved


@contextmanager
def writer_unchecked() -> Iterator[None]:
    from hubgym.rollout import writer

    saved = writer.check_rows
    writer.check_rows = lambda table, shard: None
    try:
        yield
    finally:
        writer.check_rows = saved


def timed(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    from unchecked import checks_off

    from hubgym.hub.shards import ShardSource, load_shard
    from hubgym.rollout.writer import ShardWriter

    rows = make_rows(args.rows, args.prompt, args.completion)
    with tempfile.TemporaryDirectory() as tmp:
        writer = ShardWriter(Path(tmp) / "run", "w000of001", max_rows=args.rows)
        writer.add_group(rows, flush=False)
        shard = writer.take()
        path = writer.write_shard(shard)
        source = ShardSource(str(path), str(path))

        def read() -> None:
            for batch in load_shard(source).batches():
                batch.num_rows

        def with_off(off, work) -> Callable[[], None]:
            def run() -> None:
                with off():
                    work()
            return run

        sides = {"read, every check": read, "read, no row contract": with_off(contract_off, read),
                 "read, unchecked": with_off(checks_off, read), "write, checked": lambda: writer.write_shard(shard),
                 "write, unchecked": with_off(writer_unchecked, lambda: writer.write_shard(shard))}
        for work in sides.values():  # warm: imports, page cache
            work()
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, work in sides.items():
                times[name].append(timed(work))
        writer.close()
    median = {name: statistics.median(values) * 1000 for name, values in times.items()}
    fastest = {name: min(values) * 1000 for name, values in times.items()}  # on a busy machine: the least disturbed
    print(f"{platform.machine()}, {args.rows} rows x ({args.prompt} prompt + {args.completion} completion ids), "
          f"{args.rounds} rounds\n")
    print("| side | median CPU ms a shard | fastest CPU ms |\n|---|---|---|")
    for name in sides:
        print(f"| {name} | {median[name]:.1f} | {fastest[name]:.1f} |")
    for label, ms in (("medians", median), ("fastest", fastest)):
        contract = ms["read, every check"] - ms["read, no row contract"]
        print(f"\n{label}: row contract {contract:.1f} ms of a {ms['read, every check']:.1f} ms read "
              f"({contract / ms['read, every check']:.0%}); checked / unchecked read "
              f"{ms['read, every check'] / ms['read, unchecked']:.2f}x; checked / unchecked write "
              f"{ms['write, checked'] / ms['write, unchecked']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
