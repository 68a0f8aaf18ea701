"""Does a rollout dataset pay? Online-only GRPO against offline (SFT or GRPO, with and without a reward selection)
then online, from the same seed, on SmolLM2-135M-Instruct and `arithmetic:sums`.

    python bench/bench_offline.py                          # 3 seeds, every arm: updates bench/RESULTS.md (hours)
    python bench/bench_offline.py --seeds 0 --online-steps 4 --no-write      # a quick look

The offline data is made once: the untrained model's n samples of each of the 68 training sums (the same
sampling as online steps: temperature 1, 32 tokens a reply), pushed to a local hub as a rollout repo, and
every offline arm reads it pinned to that revision: a dataset on a hub is made once and learned from many
times, so its tokens are reported beside the table, not charged to each arm. Arms, each from the same
initial weights and seed, on one vLLM engine shared by all (each run loads its weights into it first):

    online        no offline steps
    sft           offline.loss sft on every stored reply
    sft+select    offline.loss sft on the right replies (offline.select.min_reward 1): rejection sampling
    grpo          offline.loss grpo on every stored group (advantages, importance-corrected)
    grpo+select   offline.loss grpo training only the right replies, with their whole group's advantages

Held-out: the 32 test sums, `--eval-n` samples each, after the offline phase and every `--eval-every` online
steps. The table gives each arm's mean held-out reward over seeds against online steps, and the online steps
it needs to reach the online-only arm's final reward (the goal: at most half of them).

A rerun with the same `--out` resumes: the dataset (`dataset.json`) and every finished run (`curves.jsonl`, one
line per seed and arm, with the settings it ran under) are reused, so arms and seeds can be added a few at a time
(`--arms grpo --seeds 2`) and the table is always over every finished run with the current settings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import write_section  # noqa: E402

HEADING = "## Offline then online: what a rollout dataset buys (SmolLM2-135M-Instruct, arithmetic:sums)"
ENV = "arithmetic:sums"
DATA_N = 8  # samples of each training sum in the dataset: the config's grpo.n, so its groups are whole GRPO groups
ARMS = {
    "online": [],
    "sft": ["offline.loss=sft"],
    "sft+select": ["offline.loss=sft", "offline.select.min_reward=1"],
    "grpo": ["offline.loss=grpo"],
    "grpo+select": ["offline.loss=grpo", "offline.select.min_reward=1"],
}


def dataset(model: str, out: Path, n: int, engine: Callable[[], Any]) -> tuple[str, dict]:
    """The dataset this `--out` already has (dataset.json), else a new one, recorded there."""
    record = out / "dataset.json"
    if record.exists():
        saved = json.loads(record.read_text())
        return saved["ref"], saved["figures"]
    from hubgym.files import atomic_write_bytes

    ref, figures = make_dataset(model, out, n, engine())
    atomic_write_bytes(record, json.dumps({"ref": ref, "figures": figures}).encode())  # a kill leaves none or all
    return ref, figures


def make_dataset(model: str, out: Path, n: int, engine) -> tuple[str, dict]:
    """The untrained model's n samples of every training sum, pushed to a local hub; (pinned ref, figures)."""
    from hubgym.engines import SamplingArgs
    from hubgym.hub.rollouts import iter_rollouts, push_rollouts
    from hubgym.rollout import RolloutConfig, run_rollouts

    run = out / "dataset"
    started = time.perf_counter()
    run_rollouts(RolloutConfig(envs=[ENV], model=model, out=str(run), n=n, split="train",
                               sampling=SamplingArgs(temperature=1.0, max_tokens=32, seed=0), max_model_len=512),
                 engine=engine)
    seconds = time.perf_counter() - started
    rows = list(iter_rollouts([run]))
    pushed = push_rollouts(run, "bench/sums-rollouts", hub=out / "hub", name="base")
    figures = {"rows": len(rows), "tokens": sum(sum(r["completion_mask"]) for r in rows),
               "right": sum(r["reward"] == 1.0 for r in rows), "seconds": seconds}
    return f"bench/sums-rollouts@{pushed.revision}:base", figures


def run_arm(arm: str, seed: int, args, model: str, ref: str, out: Path, engine) -> dict[int, float]:
    """One training run; {online steps done: held-out mean reward}."""
    from rich.console import Console

    from hubgym.train.config import load_config
    from hubgym.train.trainer import Trainer

    offline = [f"offline.sources=[{ref}]", f"offline.steps={args.offline_steps}"] if ARMS[arm] else []
    sets = [f"model={model}", f"output_dir={out / f'seed{seed}' / arm}", f"seed={seed}",
            f"online.steps={args.online_steps}", f"eval.every={args.eval_every}", "eval.after_offline=true",
            f"eval.n={args.eval_n}", "checkpoint_every=0", "log.every=1000", *offline, *ARMS[arm]]
    trainer = Trainer(load_config("smollm2-sums", sets), console=Console(file=io.StringIO()), engine=engine,
                      hub=str(out / "hub"))
    try:
        result = trainer.run()
    finally:
        trainer.close()
        del trainer
        gc.collect()
    start = args.offline_steps if ARMS[arm] else 0
    rewards = {}
    for line in result.metrics_file.read_text().splitlines():
        record = json.loads(line)
        reward = record.get(f"eval/{ENV.split(':')[0]}/reward")
        if reward is not None and record["step"] >= start:
            rewards[record["step"] - start] = reward
    return rewards


def settings(args, ref: str) -> dict:
    """What a run's curve depends on besides its seed and arm: a finished run is reused only under the same."""
    return {"ref": ref, "offline_steps": args.offline_steps, "online_steps": args.online_steps,
            "eval_every": args.eval_every, "eval_n": args.eval_n}


def finished_runs(out: Path, wanted: dict) -> dict[tuple[int, str], dict[int, float]]:
    """{(seed, arm): curve} of the runs curves.jsonl holds under these settings (a line without its newline, which
    no run of record_run leaves, is not read)."""
    runs = {}
    for line in whole_lines(out / "curves.jsonl").splitlines():
        record = json.loads(line)
        if record["settings"] == wanted:
            runs[record["seed"], record["arm"]] = {int(step): reward for step, reward in record["curve"].items()}
    return runs


def record_run(out: Path, wanted: dict, seed: int, arm: str, curve: dict[int, float]) -> None:
    """Add a finished run to curves.jsonl, rewritten whole and atomically (a torn line left by a kill dropped)."""
    from hubgym.files import atomic_write_bytes

    path = out / "curves.jsonl"
    line = json.dumps({"seed": seed, "arm": arm, "settings": wanted, "curve": curve})
    atomic_write_bytes(path, (whole_lines(path) + line + "\n").encode())


def whole_lines(path: Path) -> str:
    """The file's text up to its last newline (a torn last line dropped); "" when there is no file."""
    text = path.read_text() if path.exists() else ""
    return text[:text.rfind("\n") + 1]


def steps_to_reach(curve: dict[int, float], target: float) -> int | None:
    return next((step for step in sorted(curve) if curve[step] >= target - 1e-9), None)


def plot(curves: dict[str, dict[int, list[float]]], path: Path, offline_steps: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, by_step in curves.items():
        steps = sorted(by_step)
        means = [statistics.mean(by_step[s]) for s in steps]
        ax.plot(steps, means, marker="o", label=arm)
        ax.fill_between(steps, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps], alpha=0.12)
    ax.axvline(0, color="grey", lw=0.8, ls="--")
    ax.text(0.05, 0.02, f"offline phase ({offline_steps} steps) ends here; online GRPO from here on", fontsize=7,
            color="grey", transform=ax.get_xaxis_transform())
    ax.set_xlabel("online GRPO steps (8 tasks x 8 samples each)")
    ax.set_ylabel("held-out mean reward (0-1)")
    ax.set_ylim(0, 1)
    ax.set_title("SmolLM2-135M on held-out sums: offline then online vs online only\n(mean over seeds; band: "
                 "min-max)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(curves: dict[str, dict[int, list[float]]], seeds: dict[str, list[int]]) -> str:
    steps = sorted({s for c in curves.values() for s in c})
    final = statistics.mean(curves["online"][max(curves["online"])])
    columns = " | ".join(f"after {s} online" for s in steps)
    head = f"| arm | seeds | {columns} | online steps to reach online-only's final |"
    lines = [head, "|" + " --- |" * (len(steps) + 3)]
    for arm, by_step in curves.items():
        means = {s: statistics.mean(v) for s, v in by_step.items()}
        cells = [f"{means[s]:.3f} ({min(by_step[s]):.2f}-{max(by_step[s]):.2f})" if s in means else "-" for s in steps]
        reach = steps_to_reach(means, final)
        reached = reach if reach is not None else "not reached"
        lines.append(f"| {arm} | {' '.join(map(str, seeds[arm]))} | " + " | ".join(cells) + f" | {reached} |")
    return "\n".join(lines) + f"\n\nMeans over each arm's seeds (min-max in brackets); online-only's final: " \
        f"{final:.3f}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--offline-steps", type=int, default=4)
    parser.add_argument("--online-steps", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--eval-n", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("out/bench-offline"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from hubgym.engines import make_engine
    from hubgym.engines.settings import EngineSettings
    from hubgym.models import resolve_model

    model = resolve_model("smollm2-135m", setting="the benchmark's model")
    started = time.perf_counter()
    engines = []  # started on first need: a rerun whose runs are all in --out only writes the table

    def engine():
        if not engines:
            engines.append(make_engine("vllm", model, max_model_len=512, settings=EngineSettings(dtype="float32"),
                                       separate_core=True))
        return engines[0]

    try:
        ref, data = dataset(model, args.out, DATA_N, engine)
        print(f"dataset {ref}: {data}", flush=True)
        wanted = settings(args, ref)
        done = finished_runs(args.out, wanted)
        for seed in args.seeds:
            for arm in args.arms:
                if (seed, arm) in done:
                    continue
                done[seed, arm] = run_arm(arm, seed, args, model, ref, args.out, engine())
                record_run(args.out, wanted, seed, arm, done[seed, arm])
                print(f"seed {seed} {arm}: {({s: round(v, 3) for s, v in sorted(done[seed, arm].items())})}",
                      flush=True)
    finally:
        for started_engine in engines:
            started_engine.close()
    minutes = (time.perf_counter() - started) / 60
    curves: dict[str, dict[int, list[float]]] = {}
    seeds: dict[str, list[int]] = {}
    for (seed, arm), curve in sorted(done.items(), key=lambda run: (list(ARMS).index(run[0][1]), run[0][0])):
        seeds.setdefault(arm, []).append(seed)
        for step, reward in curve.items():
            curves.setdefault(arm, {}).setdefault(step, []).append(reward)
    png = Path(__file__).with_name("offline-online.png")
    plot(curves, png, args.offline_steps)
    body = report(curves, seeds, args, data, minutes)
    print(body)
    if not args.no_write:
        write_section(HEADING, body)


def report(curves, seeds: dict[str, list[int]], args, data: dict, minutes: float) -> str:
    load = os.getloadavg()[0]
    return f"""Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, no GPU; Python \
{platform.python_version()}; {dt.date.today()}; load average {load:.1f} when written; {minutes:.0f} \
minutes in the last invocation (earlier invocations' runs are reused from `--out`).

Method: `python bench/bench_offline.py --offline-steps {args.offline_steps} \
--online-steps {args.online_steps} --eval-every {args.eval_every} --eval-n {args.eval_n}`. SmolLM2-135M-Instruct,
the shipped `smollm2-sums` config (lr 1e-5, 8 groups x 8 samples a step, 32 tokens a reply). The dataset, made
once: {data['rows']} rollouts ({DATA_N} of each training sum, {data['tokens']:,} sampled tokens, \
{data['right']} right, {data['seconds']:.0f} s to sample), pushed to a local hub and read pinned to its revision. \
Every offline arm takes {args.offline_steps} offline steps of 8 groups, then {args.online_steps} online steps; \
held-out: the 32 test sums x {args.eval_n} samples, evaluated after the offline phase (column 0) and every \
{args.eval_every} online steps.

{table(curves, seeds)}

![offline then online](offline-online.png)
"""


if __name__ == "__main__":
    main()
