"""Benchmark re-scoring stored rollouts: hubgym's `rescore` against a `verifiers` Rubric, per built-in env.

    python bench/bench_score.py --verifiers-python VENV/bin/python [--rows 2000]

For every built-in env, stored rollouts are made from its golden cases (each case's task and
trajectory, scored by the env's verifier), replicated to `--rows` rows and written as Arrow shards
of a run folder. Then, in one run:

- hubgym: `rescore([run])` in one process (`workers=1`) and over all cores, reading the shards;
- verifiers: the same rows, loaded in a process of the venv where `verifiers` is installed, scored
  by `Rubric.score_group` (verifiers 0.3.1 has no `score_rollouts`; `score_group` scores a list of
  states) with one reward function that calls the same hubgym verifier, so both sides run the same
  reward code and the difference is the framework. Its rows are parsed before the clock starts.

The ratio is hubgym's rows/s (one process) over verifiers' rows/s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("RESULTS.md")
HEADING = "## Re-scoring stored rollouts"


def golden_rows(env: str, count: int) -> list[dict]:
    """`count` rollout rows of `env` made from its golden cases (scored by its verifier)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_train_stream import row

    from hubgym.builders.registry import resolve_env
    from hubgym.verifiers.golden import load_golden

    builder = resolve_env(env)
    verifier = builder.verifier()
    cases = load_golden(Path(builder.source_dir()) / builder.GOLDEN, env=env)
    rows = []
    for i in range(count):
        case = cases[i % len(cases)]
        task, completion = dict(case.task), case.completion
        if completion is None:  # multi_turn cases store actions: the episode gives the trajectory
            completion = verifier.run_episode(task, case.actions).completion()
        score = verifier.score(task, completion)
        rows.append(row(env, i, 0, score.reward if score.reward is not None else 0.0, task_id=task["id"],
                        prompt=task["prompt"], completion=completion, info=task["info"],
                        interaction=task["interaction"],
                        metrics=[{"name": f"reward/{k}", "value": v} for k, v in score.components.items()]))
    return rows


class _ErrorCount(logging.Handler):
    """verifiers logs (and scores 0.0) a reward function that raises: count those, so none goes unseen."""

    count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.count += 1


def verifiers_worker(rows_file: str) -> None:
    """Runs in the verifiers venv: score the rows with a verifiers Rubric; print rows/s as JSON."""
    import asyncio

    import verifiers as vf
    from verifiers.legacy.types import State

    from hubgym.verifiers.contract import load_verifier

    items = [json.loads(line) for line in Path(rows_file).read_text().splitlines()]
    verifier = load_verifier(items[0]["verifier"])
    tasks = [item["task"] for item in items]

    def hubgym_reward(completion, info) -> float:
        score = verifier.score(tasks[info["index"]], completion)
        return score.reward if score.reward is not None else 0.0

    rubric = vf.Rubric(funcs=[hubgym_reward], weights=[1.0])
    errors = _ErrorCount()
    logging.getLogger().addHandler(errors)
    # verifiers' State reads prompt/answer/info through its `input`: the row index travels there
    states = [State(prompt=item["task"]["prompt"], completion=item["completion"], trajectory=[],
                    input={"prompt": item["task"]["prompt"], "answer": "", "info": {"index": i}})
              for i, item in enumerate(items)]
    started = time.perf_counter()
    asyncio.run(rubric.score_group(states))
    seconds = time.perf_counter() - started
    mean = sum(s["reward"] for s in states) / len(states)
    print(json.dumps({"rows": len(states), "seconds": seconds, "mean_reward": mean}))
    if errors.count:
        raise SystemExit(f"{errors.count} reward calls failed in verifiers: the comparison would be void")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifiers-python", required=True, help="python of the venv where verifiers is installed")
    parser.add_argument("--rows", type=int, default=2000, help="stored rollouts per env")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return verifiers_worker(args.worker)

    from rich.console import Console
    from rich.table import Table

    from hubgym.builders.registry import BUILTIN_ENVS, resolve_env
    from hubgym.rollout.writer import ShardWriter
    from hubgym.score.rescore import rescore

    load = os.getloadavg()
    table = Table("env", "rows", "hubgym rows/s (1 process)", f"hubgym rows/s ({os.cpu_count()} processes)",
                  "verifiers rows/s", "hubgym / verifiers", title="re-scoring stored rollouts")
    tmp = Path(tempfile.mkdtemp(prefix="hubgym-bench-score-"))
    for env in BUILTIN_ENVS:
        rows = golden_rows(env, args.rows)
        writer = ShardWriter(tmp / env, "w000of001", max_rows=512)
        writer.add_group(rows)
        writer.flush()
        one = rescore([tmp / env], workers=1)
        many = rescore([tmp / env], workers=os.cpu_count())
        assert one.changed == 0, f"{env}: stored rewards differ from a re-score"
        rows_file = tmp / f"{env}.jsonl"
        verifier = resolve_env(env).verifier()
        rows_file.write_text("".join(json.dumps({"verifier": verifier.name, "task": {
            "id": r["task_id"], "env": env, "prompt": r["prompt"], "info": r["info"], "interaction": r["interaction"]},
            "completion": r["completion"]}, default=str) + "\n" for r in rows))
        done = subprocess.run([args.verifiers_python, __file__, "--verifiers-python", args.verifiers_python,
                               "--worker", str(rows_file)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"verifiers worker failed for {env}: {done.stderr[-2000:]}")
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
        stored_mean = sum(r["reward"] for r in rows) / len(rows)
        assert abs(theirs["mean_reward"] - stored_mean) < 1e-9, f"{env}: verifiers scored {theirs['mean_reward']}"
        ours = one.rows / one.seconds
        table.add_row(env, f"{one.rows:,}", f"{ours:,.0f}", f"{many.rows / many.seconds:,.0f}",
                      f"{theirs['rows'] / theirs['seconds']:,.0f}", f"{ours / (theirs['rows'] / theirs['seconds']):.1f}x")
    console = Console(width=150, record=True)
    console.print(table)
    if not args.no_write:
        body = (f"{HEADING}\n\nMeasured {dt.date.today()} with `python bench/bench_score.py --verifiers-python VENV/bin/python` "
                f"on {platform.machine()} ({os.cpu_count()} cores), load average {load[0]:.2f} at start; verifiers 0.3.1. "
                f"Rows per env: golden cases replicated to {args.rows} (real verifier scores, synthetic token ids).\n\n"
                f"```\n{console.export_text()}```\n\nhubgym's rows/s include reading the Arrow shards, decoding rows, "
                f"scoring and building the new columns (no output written); verifiers' include only "
                f"`Rubric.score_group` on states built before the clock starts. Both call the same hubgym verifier "
                f"code, so the ratio is the cost of the frameworks around it. Target: hubgym at least 10x.\n")
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
