"""Benchmark re-scoring the same stored rollouts with hubgym (`hubgym score`) and with verifiers' own offline
re-scoring (`vf-replay`), side by side, in rows per second.

    python bench/bench_rescore_vf.py                     # updates bench/RESULTS.md
    python bench/bench_rescore_vf.py --copies 20 --no-write

The rollouts are real verifiers traces: `vf-eval hubgym_verifiers` plays `--env` (default wordle) against hubgym's
instant server (`--limit` tasks x `-r` samples; replies a trained model would write), through verifiers' `null`
harness (run by uv, as in tests/test_integration_verifiers.py). Their episode lines are repeated `--copies` times
(each copy's task ids suffixed, so a copy is its own tasks: groups of `-r` samples, as a run of many tasks has), and
`hubgym import verifiers` makes the same traces a hubgym run (one row a trace). Then, `--repeats` times, order
alternating:

- verifiers: `vf-replay`'s own `run_replay` (verifiers.v1.cli.replay), in this process: it reads every trace,
  clears its scores, runs the taskset Task's reward hooks on it and appends the re-scored trace to its output. The
  taskset is `vf_rescore_taskset` (beside this script): `hubgym_verifiers` records rewards while an episode runs,
  so its Task has no hook to re-run, and its Env is not a SingleAgentEnv, which vf-replay refuses as multi-agent;
  that module's hook is what the episode's end does, from the saved trace (hubgym's verifier, the same reward
  code hubgym runs), and its Env is verifiers' SingleAgentEnv.
- hubgym: `hubgym.rescore` (what `hubgym score` runs) over the imported run with `--out` (new shards beside the
  old columns), one worker process (`--workers`), and the default for the machine.

Both re-score every trace with the same verifier; both give the stored rewards again (checked). Rows per second is
traces re-scored over the wall time of the call (reading, scoring, writing), after imports and pool start-up.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from results import write_section  # noqa: E402  (bench/ is on sys.path when run as a script)

HEADING = "## Re-scoring stored rollouts: hubgym score vs verifiers' vf-replay"
HERE = Path(__file__).resolve().parent
TASKSET = "vf_rescore_taskset"


def vf_eval(model: Path, env: str, limit: int, samples: int, out: Path) -> Path:
    """verifiers' own evaluation of the hubgym env against the instant server: its run folder."""
    from hubgym.rollout.instant_server import InstantServer

    bin_dir = Path(sys.executable).parent
    environ = {**os.environ, "PRIME_API_KEY": "EMPTY", "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    with InstantServer(model, log_path=out.parent / "instant.log") as server:
        command = [str(bin_dir / "vf-eval"), "hubgym_verifiers", "--env.taskset.env", env, "--env.taskset.limit",
                   str(limit), "-r", str(samples), "-m", str(model), "--client.base-url", server.url(env.split(":")[0]),
                   "--no-push", "--no-rich", "-o", str(out), "--run.name", "vf", "--env.agent.harness.id", "null",
                   "--env.agent.runtime.type", "subprocess"]
        done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"vf-eval failed:\n{done.stderr[-4000:]}")
    return out / "vf"


def copied(run: Path, copies: int, out: Path) -> Path:
    """The run folder with its traces repeated `copies` times, its saved config naming the re-scoring taskset: vf-replay
    refuses a run whose taskset exports an Env that is not a SingleAgentEnv (`hubgym_verifiers`' HubgymEnv) as
    multi-agent, and takes the taskset's Env from the config the run saved."""
    import shutil

    from verifiers.v1.cli.output import saved_config_path

    shutil.copytree(run, out)
    lines = [line for line in (run / "traces.jsonl").read_text().splitlines() if line.strip()]
    (out / "traces.jsonl").write_text("\n".join(_as_copy(line, k) for k in range(copies) for line in lines) + "\n")
    config = saved_config_path(out)
    saved = json.loads(config.read_text())
    saved["env"]["taskset"]["id"] = TASKSET
    config.write_text(json.dumps(saved))
    return out


def _as_copy(line: str, k: int) -> str:
    """An episode line whose tasks are copy k's own (task ids suffixed): each copy is a group of its own, as a run
    of many tasks has, rather than one task with copies x samples rows (which would let a re-score decode each task
    once for hundreds of rows)."""
    episode = json.loads(line)
    for trace in episode["traces"]:
        data = trace["task"]["data"]
        task = json.loads(data["hubgym_task"])
        task["id"] = f"{task['id']}-copy{k}"
        data["hubgym_task"] = json.dumps(task)
    return json.dumps(episode)


def replay_verifiers(source: Path, out: Path, env: str) -> tuple[float, list[float]]:
    """(seconds, each trace's new reward) of verifiers' offline re-score of `source` into `out`."""
    from verifiers.v1.cli.output import saved_config_path
    from verifiers.v1.cli.replay import ReplayConfig, run_replay
    from verifiers.v1.cli.resolve import narrow_taskset_config

    saved = json.loads(saved_config_path(source).read_text())
    config_type = narrow_taskset_config(ReplayConfig, TASKSET)
    data = {**saved, "taskset": {"id": TASKSET, "env": env}, "rich": False, "output_dir": str(out)}
    data.pop("env", None)
    config = config_type.model_validate(data)
    started = time.perf_counter()
    traces = asyncio.run(run_replay(config, source, out))
    return time.perf_counter() - started, [t.reward for t in traces]


def rescore_hubgym(run: Path, out: Path, workers: int | None) -> tuple[float, list[float]]:
    from hubgym.hub.rollouts import iter_rollouts
    from hubgym.score import rescore

    started = time.perf_counter()
    rescore(run, out=out, workers=workers)
    seconds = time.perf_counter() - started
    return seconds, [r["rescore_reward"] for r in iter_rollouts(out)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="wordle")
    parser.add_argument("--limit", type=int, default=16, help="tasks vf-eval plays")
    parser.add_argument("-r", "--samples", type=int, default=4, help="samples per task")
    parser.add_argument("--copies", type=int, default=100, help="times each trace is repeated")
    parser.add_argument("--repeats", type=int, default=3, help="re-scores per side (order alternating)")
    parser.add_argument("--traces", type=Path, help="a vf-eval run folder of the env to use (else vf-eval runs)")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave bench/RESULTS.md alone")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))

    from rich.console import Console

    from hubgym.integrations.verifiers_import import import_verifiers
    from hubgym.models.tiny import default_tiny_model
    from hubgym.score import rescore

    console, load = Console(width=200), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-rescore-vf-"))
    model = default_tiny_model()
    with console.status("vf-eval: verifiers plays the env"):
        played = args.traces or vf_eval(model, args.env, args.limit, args.samples, work / "vf-eval")
        source = copied(played, args.copies, work / "traces")
    with console.status("hubgym import verifiers"):
        imported = import_verifiers(source, work / "hubgym-run", model=str(model), logprobs=False)
    rescore(imported.out, workers=2)  # the pool starts before any side is timed, as in a session that re-scores
    stored = [t for line in (source / "traces.jsonl").read_text().splitlines() if line.strip()
              for t in json.loads(line)["traces"]]
    traces = len(stored)
    stored_mean = statistics.fmean(sum(r["score"] * r["weight"] for r in t["rewards"].values()) for t in stored)
    sides = {"verifiers vf-replay": [], "hubgym score, 1 worker": [], "hubgym score, default workers": []}
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for name in order:
            out = work / f"out-{repeat}-{len(sides[name])}-{name.split()[0]}-{name[-9:].replace(' ', '')}"
            if name.startswith("verifiers"):
                seconds, rewards = replay_verifiers(source, out, args.env)
            else:
                seconds, rewards = rescore_hubgym(imported.out, out, 1 if "1 worker" in name else None)
            sides[name].append({"seconds": seconds, "rows": len(rewards), "mean": statistics.fmean(rewards)})
            console.print(f"{name}: {len(rewards):,} rows in {seconds:.2f} s")
    report = table(sides, traces, stored_mean)
    console.print(report)
    if not args.no_write:
        write_results(args, report, load, traces, imported.rows)


def table(sides: dict[str, list[dict]], traces: int, stored_mean: float):
    from rich.table import Table

    base = statistics.median(r["rows"] / r["seconds"] for r in sides["verifiers vf-replay"])
    t = Table("side", "rows", "runs", "median s", "rows/s (median)", "vs vf-replay", "mean new reward",
              title=f"re-scoring the same {traces:,} stored episodes (mean stored reward {stored_mean:.4f})")
    for name, runs in sides.items():
        rate = statistics.median(r["rows"] / r["seconds"] for r in runs)
        t.add_row(name, f"{runs[0]['rows']:,}", str(len(runs)), f"{statistics.median(r['seconds'] for r in runs):.2f}",
                  f"{rate:,.0f}", f"{rate / base:.1f}x", f"{runs[0]['mean']:.4f}")
    return t


def write_results(args, report, load, traces: int, rows: int) -> None:
    import verifiers
    from rich.console import Console

    capture = Console(width=160, record=True, file=open(os.devnull, "w"))
    capture.print(report)
    version = getattr(verifiers, "__version__", "0.4")
    body = (f"Measured {dt.date.today()} with `python bench/bench_rescore_vf.py` on {platform.machine()} "
            f"({os.cpu_count()} cores, no GPU), load average {load[0]:.2f} at start; verifiers {version}. The "
            f"episodes: `vf-eval hubgym_verifiers` on `{args.env}` ({args.limit} tasks x {args.samples} samples "
            f"against hubgym's instant server), repeated {args.copies} times: {traces:,} traces, imported as "
            f"{rows:,} hubgym rows. Each side re-scored them {args.repeats} times, order alternating; both give "
            f"the stored rewards back (the mean new reward column).\n\n```\n{capture.export_text()}```\n")
    write_section(HEADING, body)


if __name__ == "__main__":
    main()
