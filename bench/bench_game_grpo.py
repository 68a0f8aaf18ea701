"""GRPO on a game from the bridged families: the tiny local model learns to play Gymnasium's Blackjack.

    python bench/bench_game_grpo.py                          # gym_blackjack; writes bench/RESULTS.md
    python bench/bench_game_grpo.py --online 4 --no-write    # a smoke run

The real stack end to end, as the main job runs it for arithmetic (hubgym.app.pipeline): vLLM samples whole
multi_turn episodes (each reply one move, the verifier's `step` answering it), DeepSpeed trains, the weights sync
into vLLM after every online step. The model is the tiny local one (random weights, 0.4M parameters, `hubgym train
tiny`'s values: 16 tokens a reply). A random model never ends a reply within 16 tokens, and a reply cut at the
limit is no move (the episode ends there, with nothing), so it starts from the main job's recipe: teacher
episodes of the untrained model whose replies are held to a move (`hit` or `stick`, by a regular expression), of
which the offline stage keeps the won ones and fine-tunes on them (rejection sampling), then online GRPO on the
policy's own, unconstrained episodes. The held-out split (seeds train never draws) is evaluated before, after the
offline stage and every `--every` online steps: 64 episodes, 4 samples each, temperature 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
from pathlib import Path

from results import write_section  # bench/ is on sys.path when run as a script

HEADING = "## GRPO on a game: the tiny model on gym_blackjack"
TEACHER_FORMAT = "(hit|stick)"


def run(env: str, offline: int, online: int, every: int, out: Path) -> tuple[list[tuple[str, dict]], float]:
    """[(when, eval metrics)] at each evaluation, and the wall seconds."""
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts
    from hubgym.train.config import TINY_CONFIG, load_config
    from hubgym.train.trainer import Trainer

    cfg = load_config(TINY_CONFIG, [f"output_dir={out / 'train'}", f"envs=[{{name: '{env}'}}]",
                                    f"online.steps={online}", f"eval.every={every}", "eval.after_offline=true",
                                    "eval.limit=64", "eval.n=4", "log.every=1000", "optim.lr=3e-3",
                                    "offline.loss=sft", "offline.select.min_reward=1"])
    started = time.perf_counter()
    trainer = Trainer(cfg)
    try:
        teacher = RolloutConfig(envs=[env], model=trainer.model_dir(), out=str(out / "teacher"), n=8, limit=64,
                                split="train", sampling=SamplingArgs(max_tokens=cfg.sampling.max_tokens,
                                                                     regex=TEACHER_FORMAT),
                                max_model_len=cfg.online.max_model_len)
        run_rollouts(teacher, engine=trainer.engine(), progress=False)
        trainer.cfg.offline.sources, trainer.cfg.offline.steps = [teacher.out], offline
        result = trainer.run()
    finally:
        trainer.close()
    evals = [("before", result.before), (f"after {offline} offline SFT steps", result.after_offline)]
    for line in result.metrics_file.read_text().splitlines():
        row = json.loads(line)
        name = f"eval/{env.split(':')[0]}/reward"
        if name in row and 0 < row["step"] - offline < online:
            evals.append((f"after {row['step'] - offline} online GRPO steps", row))
    evals.append((f"after {online} online GRPO steps", result.after))
    return evals, time.perf_counter() - started


def body(env: str, offline: int, online: int, evals: list[tuple[str, dict]], seconds: float) -> str:
    name = env.split(":")[0]
    lines = [f"`python bench/bench_game_grpo.py --env {env} --offline {offline} --online {online}` "
             f"({datetime.date.today()}, the 2-core CPU machine, load average {os.getloadavg()[0]:.0f} at the end: "
             f"other work ran beside it; {seconds / 60:.1f} minutes wall). The tiny model with `hubgym train tiny`'s "
             f"values; teacher episodes: 64 training tasks x 8, replies held to `{TEACHER_FORMAT}`; offline: SFT on "
             f"the won ones; online: GRPO on the policy's own episodes. Held-out: the test split, 64 episodes x 4.",
             "", "| when | held-out reward | 95% interval | episodes won (pass@1) |", "| --- | --- | --- | --- |"]
    for when, metrics in evals:
        reward, ci = metrics[f"eval/{name}/reward"], metrics.get(f"eval/{name}/reward_ci95", 0.0)
        lines.append(f"| {when} | {reward:.3f} | {max(reward - ci, 0):.3f} - {reward + ci:.3f} | "
                     f"{metrics.get(f'eval/{name}/pass@1', float('nan')):.3f} |")
    first, last = evals[0][1][f"eval/{name}/reward"], evals[-1][1][f"eval/{name}/reward"]
    lines += ["", f"The held-out reward moves from {first:.3f} to {last:.3f}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gym_blackjack")
    parser.add_argument("--offline", type=int, default=10, help="offline SFT steps on the won teacher episodes")
    parser.add_argument("--online", type=int, default=30, help="online GRPO steps")
    parser.add_argument("--every", type=int, default=10, help="evaluate every K steps")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hubgym-game-grpo-") as tmp:
        evals, seconds = run(args.env, args.offline, args.online, args.every, Path(tmp))
    text = body(args.env, args.offline, args.online, evals, seconds)
    print(text)
    if not args.no_write:
        write_section(HEADING, text)


if __name__ == "__main__":
    main()
