"""Benchmark every built-in env: builder speed (rows/s) and verifier scoring speed (rollouts/s, one core).

    python bench/bench_envs.py                       # all built-in envs; writes bench/RESULTS.md
    python bench/bench_envs.py --envs arithmetic --seconds 1 --out results.md

Builders: one config (the first) is built twice over, side by side in the same process:
  - `build_tasks`: the full datasets path (split generators, row checks, Arrow writing, loading back);
  - `generate_tasks`: the env's raw generator alone, over the same splits and gen_kwargs.
  Their ratio is what the datasets machinery costs on top of the env's own code. Best of --repeats.
Verifiers: `Verifier.score` is called in a loop for --seconds per workload, pinned to one CPU:
  - golden: the env's golden cases (multi_turn ones replayed into completions once, before timing);
  - synthetic: every built row with a generic reply (multi_turn: three moves/guesses), as the
    conformance checker scores them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path
from typing import Any, Callable

import datasets
from rich.console import Console
from rich.table import Table

from hubgym.envs import build_tasks, make_builder, resolve_env
from hubgym.builders.registry import BUILTIN_ENVS
from hubgym.schemas import Message, Task, assistant, user
from hubgym.verifiers.contract import Verifier
from results import write_section  # bench/ is on sys.path when run as a script

GENERIC_REPLY = "Let me think step by step. My best guess is 42. <answer>42</answer>"
MOVES = ["<guess>crane</guess>", "<move>b2</move>", "<guess>slate</guess>"]  # a few env actions, mostly invalid


@dataclass
class BuildResult:
    env: str
    kind: str
    config: str
    rows: int
    build_rows_s: float
    generate_rows_s: float


@dataclass
class ScoreResult:
    env: str
    golden_cases: int
    golden_per_s: float
    synthetic_rows: int
    synthetic_per_s: float
    errors: int  # scores that came back with an error (timed like the others, and reported)


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Fastest of `repeats` runs: the least disturbed measurement of the same work."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def raw_generate(env: str, config: str) -> int:
    """Drain the env's generator over every split, as `_split_generators` describes them; return the rows."""
    builder = make_builder(env, config)
    rows = 0
    for split in builder._split_generators(datasets.DownloadManager(dataset_name=builder.ENV)):
        rows += sum(1 for _ in builder.generate_tasks(**split.gen_kwargs))
    return rows


def bench_builder(env: str, repeats: int) -> tuple[BuildResult, list[Task]]:
    cls = resolve_env(env)
    config = cls.config_names()[0]
    built = build_tasks(cls, config)  # warm-up: imports, verifier-free first run, also the rows to score
    rows = sum(len(split) for split in built.values())
    build_s = best_seconds(lambda: build_tasks(cls, config), repeats)
    generate_s = best_seconds(lambda: raw_generate(env, config), repeats)
    tasks = [row for split in built.values() for row in split]
    return BuildResult(env, cls.KIND, config, rows, rows / build_s, rows / generate_s), tasks


def rate(verifier: Verifier, items: list[tuple[Task, list[Message]]], seconds: float) -> tuple[float, int]:
    """Scores per second over `items` (cycled) for about `seconds`; also how many scores were errors."""
    for task, completion in items:  # warm-up: lazy imports and caches stay out of the timing
        verifier.score(task, completion)
    calls, errors, start = 0, 0, time.perf_counter()
    for task, completion in cycle(items):
        errors += verifier.score(task, completion).error is not None
        calls += 1
        if calls % 16 == 0 and time.perf_counter() - start >= seconds:
            break
    return calls / (time.perf_counter() - start), errors


def synthetic(task: Task) -> list[Message]:
    if task["interaction"]["kind"] == "multi_turn":
        return [m for move in MOVES for m in (assistant(move), user("(observation)"))][:-1]
    return [assistant(GENERIC_REPLY)]


def bench_verifier(env: str, tasks: list[Task], seconds: float) -> ScoreResult:
    cls = resolve_env(env)
    verifier = cls.verifier()
    golden = []
    for case in cls.golden_cases():
        completion = case.completion
        if case.actions is not None:  # replayed once, outside the timed loop
            completion = verifier.run_episode(case.task, case.actions).completion()
        golden.append((case.task, completion or []))
    rows = [(t, synthetic(t)) for t in tasks]
    golden_rate, golden_errors = rate(verifier, golden, seconds) if golden else (0.0, 0)
    rows_rate, rows_errors = rate(verifier, rows, seconds)
    return ScoreResult(env, len(golden), golden_rate, len(rows), rows_rate, golden_errors + rows_errors)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    load = os.getloadavg()[0]  # other work on the machine skews the numbers: say how busy it was
    return (f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu}; Python {platform.python_version()}; "
            f"datasets {datasets.__version__}; {datetime.date.today().isoformat()}; "
            f"load average {load:.1f} when written")


def build_table(results: list[BuildResult]) -> Table:
    table = Table("env", "kind", "config", "rows", "build_tasks rows/s", "generate_tasks rows/s",
                  "generate / build", title="builders")
    for r in results:
        table.add_row(r.env, r.kind, r.config, str(r.rows), f"{r.build_rows_s:,.0f}", f"{r.generate_rows_s:,.0f}",
                      f"{r.generate_rows_s / r.build_rows_s:.1f}x")
    return table


def score_table(results: list[ScoreResult]) -> Table:
    table = Table("env", "golden cases", "golden rollouts/s", "built rows", "synthetic rollouts/s", "errors",
                  title="verifiers (one core)")
    for r in results:
        table.add_row(r.env, str(r.golden_cases), f"{r.golden_per_s:,.0f}", str(r.synthetic_rows),
                      f"{r.synthetic_per_s:,.0f}", str(r.errors))
    return table


def markdown(table: Table) -> str:
    """A rich table as a GitHub markdown table (the same cells)."""
    headers = [str(c.header) for c in table.columns]
    cells = [[str(c) for c in column.cells] for column in table.columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in zip(*cells, strict=True)]
    return "\n".join(lines)


def overhead_note(results: list[BuildResult]) -> str:
    """One sentence on the measured range of the datasets overhead factor."""
    if not results:
        return ""
    ratio = {r.env: r.generate_rows_s / r.build_rows_s for r in results}
    lo, hi = min(ratio, key=ratio.get), max(ratio, key=ratio.get)
    return (f"Here the `datasets` path costs {ratio[lo]:.1f}x ({lo}) to {ratio[hi]:.1f}x ({hi}) the time of the raw "
            f"generator: the cheaper an env's own generator, the larger the share of row checks, Arrow encoding and "
            f"writing.")


BUILDERS_HEADING = "## Builders: rows per second"
VERIFIERS_HEADING = "## Verifiers: rollouts scored per second, one core"


def write_results(path: Path, builds: Table, scores: Table, skipped: dict[str, str], args: argparse.Namespace,
                  build_results: list[BuildResult]) -> None:
    """Rewrite this benchmark's two sections of `path` (created when missing)."""
    where = machine()
    subset = "" if args.envs == list(BUILTIN_ENVS) else " --envs " + " ".join(args.envs)
    command = f"python bench/bench_envs.py --seconds {args.seconds:g} --repeats {args.repeats}{subset}"
    missing = "".join(f"- `{env}` was not benchmarked: {why}\n" for env, why in skipped.items()) + "\n" * bool(skipped)
    builders = f"""Machine: {where}.

Each built-in env's first config, built in one process: `build_tasks` (the full `datasets` path:
split generators, row checks, Arrow writing, loading back) against draining the env's own
`generate_tasks` generator over the same splits. `generate / build` is the overhead factor of
the `datasets` machinery; it includes the fixed cost of each build (builder set-up, a fresh cache
folder, loading the table back), which weighs most on small configs. Best of {args.repeats} runs each.
Higher is better.

{markdown(builds)}

{overhead_note(build_results)}

{missing}Reproduce: `{command}`"""
    verifiers = f"""Machine: {where}.

`Verifier.score(task, completion)` in a loop for {args.seconds:g} s per workload, with the process
pinned to one CPU. Golden: the env's golden cases (multi_turn cases replayed into completions once,
outside the timed loop). Synthetic: every built row of the config above with a generic reply
(multi_turn: three moves, mostly invalid, so each score replays a short episode). `errors` counts
scores that came back as errors (none expected). Higher is better.

{markdown(scores)}

Reproduce: `{command}`"""
    write_section(BUILDERS_HEADING, builders, path)
    write_section(VERIFIERS_HEADING, verifiers, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="*", default=list(BUILTIN_ENVS), help="envs to run (default: every built-in)")
    parser.add_argument("--seconds", type=float, default=2.0, help="time per verifier workload")
    parser.add_argument("--repeats", type=int, default=3, help="builds per measurement (the best counts)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    args = parser.parse_args()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    console = Console(width=120)
    builds, scores, skipped = [], [], {}
    for env in args.envs:
        try:
            result, tasks = bench_builder(env, args.repeats)
        except Exception as exc:  # an env that does not load or build is listed, not benchmarked
            skipped[env] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            console.print(f"[red]skipped {env}:[/red] {skipped[env]}", markup=True, highlight=False)
            continue
        builds.append(result)
        cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cpus)})  # one core: scoring is single-threaded Python
        try:
            scores.append(bench_verifier(env, tasks, args.seconds))
        finally:
            os.sched_setaffinity(0, cpus)
        console.print(f"done {env}")
    build_t, score_t = build_table(builds), score_table(scores)
    console.print(build_t, score_t)
    write_results(args.out, build_t, score_t, skipped, args, builds)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
