"""Benchmark re-scoring stored rollouts: hubgym's `rescore` against a `verifiers` Rubric, per built-in env.

    python bench/bench_score.py --verifiers-python VENV/bin/python [--rows 4000 --repeats 3]
    python bench/bench_score.py --no-verifiers --rows 100000 --envs arithmetic,calc_tools,reverse_text --no-write

VENV is a separate virtualenv with `pip install verifiers==0.3.1` plus hubgym's light dependencies
(this repository goes on its PYTHONPATH, so both sides run the same reward code).

Stored rollouts, written as run folders of Arrow shards (512 rows each) by hubgym's ShardWriter:
- every built-in env: its golden cases (task + trajectory; multi_turn cases played from their
  actions) scored by its verifier and replicated to `--rows` rows (synthetic token ids), in groups of
  8 rows per task as a run with `--n 8` stores them (each group a task id of its own);
- one real run: `--vllm-env` sampled with vLLM and the tiny local model (`--vllm-tasks` x `--n`).

Then, per env, `--repeats` rounds in which each way below takes its turn (the machine's load drifts, and
turns keep the ratios fair), after one warm-up of each re-score; medians shown:
- reward code alone: `Verifier.score_batch` over rows decoded beforehand, in batches of a re-score's
  size (512 rows), the collector paused: the floor of any framework running this reward code in one
  process (a verifier's batch rewards get each batch in one call, as in a re-score);
- decode + score only: map each shard, decode what `Verifier.score_batch(tasks, completions)` is given
  (a task dict per task, as hubgym.score.tasks shares them, and message dicts per row) and call it; no
  hash, no checks, no new columns, no diff: what a one-process re-score can reach at best, since the
  contract's Python objects must be built;
- hubgym: `rescore(run)` in one process, over every core, and in one process writing the new
  shards; each reads the shards, decodes the rows, scores them and builds the new columns;
- hubgym, checks off: `rescore(run)` in one process with the per-batch checks of hubgym.hub.shard_checks
  switched off (bench/unchecked.py): the reading as it was before every batch was fully validated, so
  "checks' cost" is what that validation costs a re-score (1 - checked rows/s / unchecked rows/s);
- checks alone: `check_batch` over every batch of the mapped shards and nothing else; "checks' share" is the
  share of a one-process re-score's time they take (hubgym 1 proc rows/s over checks alone rows/s), a
  steadier measure of the same cost than the difference of two noisy rates;
- verifiers, in a process of its venv, shard by shard as hubgym streams them: read a shard
  (column-wise, as hubgym does), build one State per row, then `Rubric.score_group(states)` (0.3.1
  has no `score_rollouts`; score_group is its batch scoring call). The Rubric holds one reward function
  per hubgym reward component with the same weight (`REWARDS` and `BATCH_REWARDS`, a batch reward called
  with a batch of one, plus the summed step rewards of a multi_turn env and the tool-call shaping of a
  tool_use env), each calling hubgym's function.

Both sides must reproduce every stored reward (checked), so they do the same work; the ratio is
hubgym's rows/s over verifiers' (read + score) rows/s. "hubgym / reward code alone" is hubgym's
1-process rows/s over the reward code's: the framework's own cost (reading and checking the shards,
decoding rows, building the new columns, the diff). "fixed" is a re-score of one row (one shard): what
a re-score costs whatever its size. With `--no-verifiers` the verifiers side is left out (large runs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from results import write_section  # noqa: E402  (bench/ is on sys.path when run as a script)
HEADING = "## Re-scoring stored rollouts"
COLUMNS = ("task_id", "env", "prompt", "completion", "info", "interaction", "reward")  # what both sides read


# ---------------------------------------------------------------- stored rollouts

GROUP = 8  # rows per task, as a run with `--n 8` stores them


def golden_rows(env: str, count: int) -> list[dict]:
    """`count` rollout rows of `env`: its golden cases, scored by its verifier, replicated in groups of GROUP rows
    per task (each group a task of its own id, as a run's tasks are; a group holds one golden case)."""
    from hubgym.envs import resolve_env

    builder = resolve_env(env)
    verifier = builder.verifier()
    cases = builder.golden_cases()
    trajectories = [(dict(c.task), c.completion if c.completion is not None
                     else verifier.run_episode(dict(c.task), c.actions).completion()) for c in cases]
    rows = []
    for i in range(count):
        task, completion = trajectories[i // GROUP % len(trajectories)]
        rows.append(stored_row(i, {**task, "id": f"{task['id']}-{i // GROUP}"}, completion, verifier))
    return rows


def stored_row(i: int, task: dict, completion: list[dict], verifier) -> dict:
    """A rollout row as `hubgym rollout` lays one out (token ids synthetic: re-scoring never reads them)."""
    score = verifier.score(task, completion)
    metrics = [{"name": f"reward/{k}", "value": v} for k, v in score.components.items()]
    metrics.append({"name": "success", "value": float(score.error is None and verifier.succeeded(score))})
    return {
        "rollout_id": f"bench-{task['id']}-{i}", "run_id": "bench", "task_id": task["id"], "env": task["env"],
        "group": f"bench-{task['id']}", "sample": i, "prompt": task["prompt"], "completion": completion,
        "info": task["info"], "interaction": task["interaction"], "prompt_ids": list(range(1, 65)),
        "completion_ids": [7] * 32, "completion_mask": [1] * 32, "completion_logprobs": [-1.0] * 32,
        "tokens_consistent": True, "reward": score.reward, "metrics": metrics, "finish_reason": "stop",
        "truncated": False, "num_turns": 1, "error": score.error,
        "provenance": {"model": "golden", "policy_version": 0, "sampling": "{}", "env_repo": None,
                       "env_revision": None, "verifier_module": verifier.name, "verifier_sha256": verifier.sha256,
                       "engine": "none", "engine_version": "0", "chat_template_sha256": None},
        "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0},
        "created_at": dt.datetime.now(dt.timezone.utc),
    }


def write_run(folder: Path, rows: list[dict]) -> Path:
    """A run folder as `hubgym rollout` leaves one: 512-row shards and a manifest recording each one's sha256."""
    from hubgym.rollout.writer import ShardWriter
    from hubgym.schemas.version import SCHEMA_VERSION

    writer = ShardWriter(folder, "w000of001", max_rows=512)
    for start in range(0, len(rows), 512):
        writer.add_group(rows[start:start + 512])
    writer.flush()
    envs = {row["env"]: row["provenance"] for row in rows}
    writer.write_manifest({
        "schema_version": SCHEMA_VERSION, "run_id": "bench", "worker": writer.worker, "model": "golden",
        "policy_version": 0, "sampling": "{}", "engine": "none", "engine_version": "0", "chat_template_sha256": None,
        "envs": {env: {"config": None, "tasks": None, "verifier_module": p["verifier_module"],
                       "verifier_sha256": p["verifier_sha256"], "env_repo": None, "env_revision": None}
                 for env, p in envs.items()},
        "split": "test", "n": 1, "rows": writer.rows_written, "shards": [p.name for p in writer.shards()],
        "shard_files": writer.shard_files(), "updated_at": dt.datetime.now(dt.timezone.utc).isoformat()})
    return folder


def vllm_run(folder: Path, env: str, tasks: int, n: int) -> Path:
    """A real rollout run: vLLM's offline engine, the tiny local model."""
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts
    from hubgym.models.tiny import default_tiny_model

    config = RolloutConfig(envs=[env], model=str(default_tiny_model()), out=str(folder), n=n, limit=tasks,
                           split="train", sampling=SamplingArgs(max_tokens=24), max_model_len=1024)
    run_rollouts(config, progress=False)
    return folder


# ---------------------------------------------------------------- the two sides

def rates(run: Path, env: str, out: Path, repeats: int) -> dict[str, float]:
    """Median rows/s of each way of scoring `run`: the reward code alone, decode + score only, and `rescore` in
    1 process, over every core and in 1 process writing shards. The ways take turns in every repeat, so a
    change in the machine's load (other jobs share it) moves them together and their ratios stay fair. Each
    `rescore` way is warmed up once first (the verifier imported, polars warm, the pool of every core started
    and kept, as it is for a process that re-scores again)."""
    from hubgym.envs import resolve_env
    from hubgym.score.rescore import rescore

    verifier = resolve_env(env).verifier()
    paths = sorted((run / "shards").glob("*.arrow"))

    def rescored(workers: int, target: Path | None) -> float:
        result = rescore(run, workers=workers, out=target)
        if result.changed or result.counts["rescore_errors"].sum():
            raise RuntimeError(f"{run}: a re-score with the same verifier changed {result.changed} rows")
        return result.rows_per_s

    def unchecked() -> float:
        from unchecked import checks_off

        with checks_off():
            return rescored(1, None)

    def checks_alone() -> float:
        """Rows/s of the per-batch checks alone (check_batch over every batch of the mapped shards)."""
        import pyarrow as pa

        from hubgym.hub.shard_checks import check_batch

        started, rows = time.perf_counter(), 0
        for path in paths:
            reader = pa.ipc.open_file(pa.memory_map(str(path)))
            ids: set[str] = set()
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                check_batch(batch, path.name, rows, ids)
                rows += batch.num_rows
        return rows / (time.perf_counter() - started)

    cores = os.cpu_count()
    ways = {"alone": lambda: reward_code_rate(paths, env, verifier), "checks": checks_alone,
            "bare": lambda: decode_and_score_rate(paths, verifier),
            "one": lambda: rescored(1, None), "unchecked": unchecked, "all": lambda: rescored(cores, None),
            "write": lambda: rescored(1, out)}
    rescored(1, None), rescored(cores, None)
    measured: dict[str, list[float]] = {key: [] for key in ways}
    for _ in range(repeats):
        for key, way in ways.items():
            measured[key].append(way())
    return {key: statistics.median(values) for key, values in measured.items()}


def fixed_seconds(folder: Path, env: str, repeats: int) -> float:
    """Median seconds of a 1-process re-score of a one-row run: the cost that does not grow with rows."""
    from hubgym.score.rescore import rescore

    run = write_run(folder, golden_rows(env, 1))
    rescore(run, workers=1)
    return statistics.median(rescore(run, workers=1).seconds for _ in range(max(repeats, 5)))


def reward_code_rate(paths: list[Path], env: str, verifier) -> float:
    """Rows/s of `Verifier.score_batch` alone over rows decoded beforehand, in batches of the size a re-score
    scores at once (CHUNK_ROWS), the collector paused as a re-score pauses it: the floor."""
    import pyarrow as pa

    from hubgym.score.scoring import CHUNK_ROWS, collector_paused

    tasks, completions = [], []
    for path in paths:
        for row in pa.ipc.open_file(path).read_all().select(list(COLUMNS)).to_pylist():
            info = json.loads(row["info"]) if isinstance(row["info"], str) else row["info"]
            tasks.append({"id": row["task_id"], "env": env, "prompt": row["prompt"], "info": info,
                          "interaction": row["interaction"]})
            completions.append(row["completion"])
    with collector_paused():
        started = time.perf_counter()
        for start in range(0, len(tasks), CHUNK_ROWS):
            verifier.score_batch(tasks[start:start + CHUNK_ROWS], completions[start:start + CHUNK_ROWS])
        return len(tasks) / (time.perf_counter() - started)


def decode_and_score_rate(paths: list[Path], verifier) -> float:
    """Rows/s of the least any framework can do to hand `Verifier.score_batch` its arguments from stored shards:
    map each shard (no sha256, no checks), decode each task once (`decode_tasks`) and the completions
    (`to_pylist`), call `Verifier.score_batch` on the shard's rows, keep the rewards; the collector paused shard
    by shard, as hubgym's scoring pauses it batch by batch. Nothing else: no metrics, no diff, no output: the
    most a re-score in one process can reach."""
    import pyarrow as pa

    from hubgym.score.scoring import collector_paused
    from hubgym.score.tasks import decode_tasks

    started, rewards = time.perf_counter(), []
    for path in paths:
        with collector_paused():
            table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
            tasks = decode_tasks(table)
            completions = table.column("completion").combine_chunks().to_pylist()
            rewards += [score.reward for score in verifier.score_batch(tasks, completions)]
            del tasks, completions  # freed while the collector is paused, as hubgym's are
    return len(rewards) / (time.perf_counter() - started)


def verifiers_rates(python: str, run: Path, env: str, repeats: int) -> dict[str, float]:
    done = subprocess.run([python, __file__, "--worker", str(run), env, str(repeats)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"verifiers worker failed for {env}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class _Errors(logging.Handler):
    """verifiers logs a reward function that raises (and scores it 0.0): count them, none may go unseen."""

    count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.levelno >= logging.ERROR


def rubric_for(verifier, shaped: bool):
    """A verifiers Rubric with one reward function per hubgym reward component, same weights."""
    import verifiers as vf

    from hubgym.verifiers.contract import actions_of
    from hubgym.verifiers.rewards import tool_call_reward

    def component(fn, name):
        def reward(completion, info) -> float:
            return fn(info["task"], completion)
        reward.__name__ = name
        return reward

    funcs, weights = [], []
    for name, (fn, weight) in verifier.rewards.items():
        funcs.append(component(fn, name))
        weights.append(weight)
    for name, (fn, weight) in verifier.batch_rewards.items():  # a Rubric scores row by row: a batch of one
        funcs.append(component(lambda task, completion, fn=fn: fn([task], [completion])[0], name))
        weights.append(weight)
    if verifier.multi_turn:
        def steps(task, completion) -> float:
            return sum(s.reward for s in verifier.run_episode(task, actions_of(completion)).steps)
        funcs.append(component(steps, "steps"))
        weights.append(1.0)
    if shaped:
        funcs.append(component(tool_call_reward, "tool_calls"))
        weights.append(1.0)
    return vf.Rubric(funcs=funcs, weights=weights)


def verifiers_worker(run: str, env: str, repeats: int) -> None:
    """In the verifiers venv: read the run's shards, score every row with a Rubric; print rows/s as JSON."""
    import asyncio

    import pyarrow as pa
    from verifiers.legacy.types import State

    from hubgym.envs import resolve_env

    verifier = resolve_env(env).verifier()
    errors = _Errors()
    logging.getLogger().addHandler(errors)
    shards = sorted(Path(run, "shards").glob("*.arrow"))
    total, scoring = [], []
    for _ in range(repeats + 1):  # the first round warms up (imports, first calls) and is not counted
        rows, reading, scored, worst = 0, 0.0, 0.0, 0.0
        for path in shards:  # shard by shard, as hubgym streams: one shard's states alive at a time
            started = time.perf_counter()
            states, stored = read_states(pa, State, path)
            rubric = rubric_for(verifier, any(s["input"]["info"]["task"]["interaction"]["tool_rewards"]
                                              for s in states))
            ready = time.perf_counter()
            asyncio.run(rubric.score_group(states))
            reading, scored = reading + ready - started, scored + time.perf_counter() - ready
            rows += len(states)
            worst = max(worst, *(abs(s["reward"] - r) for s, r in zip(states, stored)))
        total.append(rows / (reading + scored))
        scoring.append(rows / scored)
        if worst > 1e-9 or errors.count:
            raise SystemExit(f"{env}: verifiers did not reproduce the stored rewards (max diff {worst}, "
                             f"{errors.count} failed reward calls): the comparison would be void")
    print(json.dumps({"rows": rows, "total": statistics.median(total[1:]), "score": statistics.median(scoring[1:])}))


def read_states(pa, State, path: Path) -> tuple[list, list[float]]:
    """One shard as verifiers States (the task rides in `info`), and the stored rewards."""
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    cols = {name: table.column(name).to_pylist() for name in COLUMNS}
    states = []
    for i in range(table.num_rows):
        info = cols["info"][i]
        task = {"id": cols["task_id"][i], "env": cols["env"][i], "prompt": cols["prompt"][i],
                "info": json.loads(info) if isinstance(info, str) else info, "interaction": cols["interaction"][i]}
        states.append(State(prompt=task["prompt"], completion=cols["completion"][i], trajectory=[],
                            input={"prompt": task["prompt"], "answer": "", "info": {"task": task}}))
    return states, cols["reward"]


# ---------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifiers-python", help="python of the venv where verifiers 0.3.1 is installed")
    parser.add_argument("--rows", type=int, default=4000, help="stored rollouts per env (golden cases replicated)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm-env", default="arithmetic:medium", help="env of the real vLLM run ('' for none)")
    parser.add_argument("--vllm-tasks", type=int, default=256)
    parser.add_argument("--n", type=int, default=8, help="samples per task of the vLLM run")
    parser.add_argument("--envs", help="comma-separated built-in envs to measure (default: all)")
    parser.add_argument("--no-verifiers", action="store_true", help="leave out the verifiers side")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return verifiers_worker(args.worker[0], args.worker[1], int(args.worker[2]))
    if not args.verifiers_python and not args.no_verifiers:
        parser.error("--verifiers-python is required (or --no-verifiers)")

    from rich.console import Console

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hubgym-bench-score-") as folder:
        table = measure(Path(folder), args)
    load_end = os.getloadavg()
    console = Console(width=170, record=True)
    console.print(table)
    if not args.no_write:
        write_results(console.export_text(), args, load_start, load_end)


def measure(tmp: Path, args):
    """Write the stored runs under `tmp`, measure both sides on each; the rich table of rows/s."""
    from rich.table import Table

    from hubgym.builders.registry import BUILTIN_ENVS

    envs = args.envs.split(",") if args.envs else BUILTIN_ENVS
    runs = [(env, env, write_run(tmp / env, golden_rows(env, args.rows))) for env in envs]
    if args.vllm_env and not args.envs:
        env = args.vllm_env.split(":")[0]
        runs.append((f"{env} (vLLM run)", env, vllm_run(tmp / "vllm", args.vllm_env, args.vllm_tasks, args.n)))
    cores = os.cpu_count()
    columns = ["env", "rows", "reward code alone", "decode + score only", "hubgym 1 proc", f"hubgym {cores} procs",
               "hubgym 1 proc + write", "hubgym 1 proc, checks off", "checks' cost", "checks alone",
               "checks' share of 1 proc",
               "decode + score only / reward code alone", "hubgym / reward code alone (1 proc)", "fixed (ms)"]
    if not args.no_verifiers:
        columns += ["verifiers read + score", "verifiers score only", "hubgym / verifiers (1 proc; best)"]
    table = Table(*columns, title="re-scoring stored rollouts: rows/s (median of repeats)")
    for label, env, run in runs:
        ours = rates(run, env, tmp / "out" / label.replace(" ", "_"), args.repeats)
        alone, bare = ours["alone"], ours["bare"]
        fixed = fixed_seconds(tmp / "one" / label.replace(" ", "_"), env, args.repeats)
        rows = sum(1 for _ in iter_rows(run))
        cells = [label, f"{rows:,}", f"{alone:,.0f}", f"{bare:,.0f}", f"{ours['one']:,.0f}", f"{ours['all']:,.0f}",
                 f"{ours['write']:,.0f}", f"{ours['unchecked']:,.0f}", f"{1 - ours['one'] / ours['unchecked']:.0%}",
                 f"{ours['checks']:,.0f}", f"{ours['one'] / ours['checks']:.0%}",
                 f"{bare / alone:.2f}x", f"{ours['one'] / alone:.2f}x", f"{fixed * 1000:.1f}"]
        if not args.no_verifiers:
            theirs = verifiers_rates(args.verifiers_python, run, env, args.repeats)
            best = max(ours["one"], ours["all"])
            cells += [f"{theirs['total']:,.0f}", f"{theirs['score']:,.0f}",
                      f"{ours['one'] / theirs['total']:.1f}x; {best / theirs['total']:.1f}x"]
        table.add_row(*cells)
    return table


def iter_rows(run: Path):
    import pyarrow as pa

    for path in sorted((run / "shards").glob("*.arrow")):
        yield from range(pa.ipc.open_file(path).read_all().num_rows)


def write_results(table: str, args, load_start, load_end) -> None:
    """Replace this benchmark's section of RESULTS.md (and only it)."""
    import pyarrow
    import vllm

    command = " ".join(["python bench/bench_score.py", "--no-verifiers" if args.no_verifiers else
                        "--verifiers-python VENV/bin/python", f"--rows {args.rows} --repeats {args.repeats}",
                        f"--envs {args.envs}" if args.envs else ""]).strip()
    body = (f"Measured {dt.date.today()} with `{command}` on {platform.machine()} "
            f"({os.cpu_count()} cores, no GPU); load average {load_start[0]:.2f} at the start and {load_end[0]:.2f} at "
            f"the end (other jobs shared the machine). verifiers 0.3.1, pyarrow {pyarrow.__version__}, "
            f"vLLM {vllm.__version__}. Each built-in env: its golden cases replicated to {args.rows} stored rows; "
            f"`{args.vllm_env} (vLLM run)`: {args.vllm_tasks} tasks x {args.n} samples of a real vLLM run "
            f"with the tiny model.\n\n```\n{table}```\n")
    write_section(HEADING, body)


if __name__ == "__main__":
    main()
