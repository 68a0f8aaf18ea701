"""`hubgym rollout`, `report` and `push-rollouts`: sample rollouts into shards, summarize them, upload them.

    hubgym rollout arithmetic:easy wordle --limit 8 --n 4 --out runs/r1
    hubgym rollout --mix mix.yaml --tasks 1000 --n 4 --out runs/r2      # draws of a mixture of env configs
    hubgym rollout arithmetic --out /shared/runs/r3 --ray --ray-address HEAD:6379 --workers 8   # on a Ray cluster
    hubgym report runs/r1
    hubgym push-rollouts runs/r1 me/rollouts --hub hubs/local
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from hubgym.app import views
from hubgym.schemas.text import plain
from hubgym.cli.app import (HUB_HELP, SKIP_BAD_HELP, Verbose, app, console, fail,
                            skipped_shards_noted, user_errors)
from hubgym.engines.settings import KINDS
from hubgym.envs.pins import PIN_HELP, parse_pins


MAX_MIX_TASKS = 1_000_000  # tasks a --mix run draws (and holds) up front: about 1-5 KB each


EngineKind = Enum("EngineKind", {kind: kind for kind in KINDS}, type=str)  # vllm: offline here; openai: a server


@app.command()
@user_errors
def rollout(
    envs: Annotated[Optional[list[str]], typer.Argument(help="ENV or ENV:CONFIG (name, versioned id or folder), one "
                                                             "or more (or --mix)")] = None,
    model: Annotated[str, typer.Option(help="model folder (or name served at --base-url); 'tiny' makes a tiny "
                                            "local model")] = "tiny",
    engine: Annotated[EngineKind, typer.Option(help="vllm: offline engine in this process; openai: a server")]
    = EngineKind["vllm"],
    base_url: Annotated[Optional[str], typer.Option(help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")]
    = None,
    mode: Annotated[str, typer.Option(help="openai engine: 'tokens' (token-in), 'chat' (server renders, native tool "
                                           "calls) or 'chat_tokens' (token-in with native tool calls)")]
    = "tokens",
    n: Annotated[int, typer.Option(min=1, help="samples per task (one GRPO group)")] = 4,
    limit: Annotated[Optional[int], typer.Option(min=1, help="tasks per env [default: the whole split]")] = None,
    split: Annotated[str, typer.Option(help="split to sample tasks from")] = "test",
    out: Annotated[Path, typer.Option(help="run folder (re-running resumes)")] = Path("runs/rollout"),
    max_tokens: Annotated[int, typer.Option(min=1, help="tokens per turn")] = 128,
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    max_model_len: Annotated[Optional[int], typer.Option(min=16, help="context length [default: the model's own "
                                                                      "(max_position_embeddings in its config.json)]")]
    = None,
    shard_index: Annotated[int, typer.Option(min=0, help="this worker's index")] = 0,
    num_shards: Annotated[int, typer.Option(min=1, help="number of workers splitting the tasks")] = 1,
    hub: Annotated[Optional[str], typer.Option(help="where org/name@revision envs load from and --push goes: 'hf', "
                                                    "a Hub-API URL or a local hub folder [default: $HUBGYM_HUB]")]
    = None,
    trust: Annotated[bool, typer.Option(help="run hub envs' verifiers unpinned")] = False,
    pin: Annotated[Optional[list[str]], typer.Option(help=PIN_HELP)] = None,
    push: Annotated[Optional[str], typer.Option(help="after the run, push its shards to this rollout repo "
                                                     "(org/name; the run id is the config)")] = None,
    mix: Annotated[Optional[Path], typer.Option(help="a mixture spec (YAML/JSON: env names, families, tags, "
                                                     "weights; see hubgym.mixture.spec): sample --tasks draws of it "
                                                     "instead of ENVs, seeded by --seed")] = None,
    tasks: Annotated[Optional[int], typer.Option(min=1, help="with --mix: tasks to draw (no task twice)")] = None,
    ray: Annotated[bool, typer.Option("--ray", help="run --workers workers (one per shard, one vLLM engine and GPU "
                                                    "each) on a Ray cluster: RAY_ADDRESS's, else a local one; "
                                                    "needs hubgym\\[ray]")] = False,
    ray_address: Annotated[Optional[str], typer.Option(help="with --ray: the cluster's head HOST:PORT, or 'auto' "
                                                            "(a cluster started on this machine)")] = None,
    workers: Annotated[Optional[int], typer.Option(min=1, help="with --ray: workers, one per shard \\[default: 1]")]
    = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="any rollout option, key=value (repeatable), "
                                                        "e.g. vllm.dtype=bfloat16, concurrency=64, "
                                                        "tool_parser=qwen3_coder; see --options")] = None,
    options: Annotated[bool, typer.Option("--options", help="list every rollout option and exit")] = False,
    verbose: Verbose = False,
) -> None:
    """Sample rollouts with vLLM, score them, and write Arrow shards; then print a table per env."""
    from hubgym.engines.vllm_logging import set_verbose

    set_verbose(verbose)
    if options:
        print_options()
        return
    if (mix is None) == (not envs):
        fail("name the envs to sample (ENV[:CONFIG]...) or a mixture (--mix SPEC --tasks N), one of the two")
    if mix is not None and (tasks is None or limit is not None):
        fail("--mix draws --tasks N tasks from the mixture: give --tasks N (and no --limit, which is per env)")
    if tasks is not None and mix is None:
        fail("--tasks N is the number of tasks drawn from a mixture: give --mix SPEC too, or use --limit per env")
    if tasks is not None and tasks > MAX_MIX_TASKS:  # drawn before sampling starts: 10^12 of them never would be
        fail(f"--tasks {tasks:,}: a mixture run draws its tasks before it samples, at most {MAX_MIX_TASKS:,}; sample "
             f"more as several runs (another --seed each) into their own --out folders")
    if mix is not None:
        from hubgym.mixture import load_mix_spec

        load_mix_spec(mix)  # an unreadable or invalid spec: one line, before any model loads
    on_ray = ray or ray_address is not None
    check_ray_options(on_ray, workers, shard_index, num_shards)
    from hubgym.models import FALLBACK_CONTEXT, LOCAL_NAMES, context_length, resolve_model
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts, scan_rollouts, summarize

    from hubgym.rollout.options import with_options

    sets = list(set_ or [])
    config = with_options(RolloutConfig(envs=list(envs or []), mix=str(mix) if mix else None, tasks=tasks,
                                        model=model, out=str(out), engine=engine.value, base_url=base_url, mode=mode,
                                        n=n, limit=limit, split=split, shard_index=shard_index,
                                        num_shards=num_shards, hub=hub, trust=trust, pins=parse_pins(pin),
                                        sampling=SamplingArgs(temperature=temperature, max_tokens=max_tokens,
                                                              seed=seed)), sets)  # every value checked here
    if any(item.strip().startswith("max_model_len=") for item in sets):
        max_model_len = config.max_model_len
    config.vllm.check_for(config.engine)  # before any model loads: one line naming the setting
    if config.engine == "openai":  # the model is a name the server knows; its limit is the server's
        if not config.base_url:
            fail("--engine openai needs --base-url, e.g. http://127.0.0.1:8000/v1 (a vLLM server: "
                 "`hubgym serve MODEL` starts one)")
        if config.model in LOCAL_NAMES:  # the folder hubgym made here: the server serves it, its tokenizer is here
            config = replace(config, model=resolve_model(config.model, setting="--model"))
        elif config.mode in ("tokens", "chat_tokens"):  # token-in: the model's tokenizer must load here, offline too
            resolve_model(config.model, setting="--model", needs=("tokenizer_config.json", "tokenizer.json"))
        config = replace(config, max_model_len=max_model_len or FALLBACK_CONTEXT)
    else:
        folder = resolve_model(config.model, setting="--model")
        config = replace(config, model=folder,
                         max_model_len=context_length(folder, max_model_len, setting="--max-model-len"))
    try:
        if on_ray:
            from hubgym.cluster.ray_rollout import run_on_ray

            summary = run_on_ray(config, workers=workers or 1, address=ray_address, console=console())
        else:
            summary = run_rollouts(config)
    except KeyboardInterrupt:
        console(stderr=True).print(f"[yellow]interrupted: the rollouts stored in {out} stay; the same command resumes "
                                    f"(no rollout sampled twice or left out)")
        raise typer.Exit(130)
    console().print(views.frame_table(summarize(scan_rollouts([out])), title=f"run {summary.run_id}: {out}"))
    by = f" by {summary.workers} Ray worker(s)" if on_ray else ""
    restarts = getattr(summary, "restarts", {})
    if restarts:
        by += f" ({', '.join(f'{w} restarted {k}x' for w, k in sorted(restarts.items()))})"
    console().print(Text(f"{summary.written} rollouts written{by} ({summary.skipped} already stored) in "
                          f"{summary.seconds:.1f}s, {summary.generated_tokens / max(summary.seconds, 1e-9):,.0f} "
                          f"generated tokens/s; shards in {out / 'shards'}"), soft_wrap=True)
    if push:
        from hubgym.hub.rollouts import push_rollouts

        pushed = push_rollouts(out, push, hub=hub, progress=True)
        console().print(Text(f"pushed {pushed.uploaded} shard(s) ({pushed.skipped} already there): {pushed.rows} "
                              f"rollouts -> {pushed.ref}"), soft_wrap=True)


def check_ray_options(on_ray: bool, workers: int | None, shard_index: int, num_shards: int) -> None:
    """--workers belongs to --ray, which splits the tasks itself: one line for options that do not fit."""
    if workers is not None and not on_ray:
        fail(f"--workers {workers} starts that many workers on a Ray cluster: add --ray (or start workers by hand "
             f"with --shard-index i --num-shards N)")
    if on_ray and (shard_index, num_shards) != (0, 1):
        fail("--ray gives worker i of --workers N the shard --shard-index i --num-shards N itself: leave out "
             "--shard-index and --num-shards")


def print_options() -> None:
    """Every rollout option with its default and what it does (the keys `--set` takes)."""
    from rich.table import Table

    from hubgym.rollout.options import rollout_options

    table = Table("option", "default", "what it does", title="rollout options (--set key=value)")
    for key, default, description in rollout_options():
        table.add_row(key, default, description)
    console().print(table)


@app.command("report")
@user_errors
def report_rollouts(sources: Annotated[list[Path], typer.Argument(help="shard files or run folders")],
                    plot: Annotated[Optional[Path], typer.Option(help="PNG of rewards per env "
                                                                 "[default: SOURCE/rewards.png]")] = None,
                    k: Annotated[Optional[int], typer.Option("--k", min=1, help="k of pass@k, capped at each env's "
                                                             "smallest group [default: that group's size]")] = None,
                    skip_bad: Annotated[bool, typer.Option(help=SKIP_BAD_HELP)] = False,
                    ) -> None:
    """Summarize stored rollouts per env (rewards, pass@1, pass@k, answer-format and tool-call parse failures,
    turns, truncation, errors) + a PNG of reward counts, rates and components."""
    from hubgym.rollout import plot_rewards, scan_rollouts, summarize
    from hubgym.hub.rollout_stats import non_finite_rewards

    with skipped_shards_noted():  # each shard is checked as iter_rollouts checks it
        rollouts = scan_rollouts(sources, skip_bad=skip_bad)
    console().print(views.frame_table(summarize(rollouts, k), title=f"rollouts in {', '.join(map(str, sources))}"))
    for bad in non_finite_rewards(rollouts).iter_rows(named=True):
        console(stderr=True).print(Text(f"note: {bad['rows']} row(s) of {plain(bad['env'])} store a reward that is "
                                        f"not a finite number ({', '.join(bad['values'])}; the first: rollout "
                                        f"{bad['first']!r}): counted in errors, left out of every reward column",
                                        style="yellow"))
    target = plot or (sources[0] if sources[0].is_dir() else sources[0].parent) / "rewards.png"
    console().print(Text(f"plot: {plot_rewards(rollouts, target, k)}"), soft_wrap=True)


@app.command("push-rollouts")
@user_errors
def push_rollouts(run: Annotated[Path, typer.Argument(help="run folder written by `hubgym rollout`")],
                  repo: Annotated[str, typer.Argument(help="rollout dataset repo, e.g. my-org/rollouts")],
                  name: Annotated[Optional[str], typer.Option(help="config name of the run [default: run id]")] = None,
                  hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None) -> None:
    """Upload a run's shards as one config of a rollout repo (validated, resumable, one card for all runs)."""
    from hubgym.hub.rollouts import push_rollouts as push

    result = push(run, repo, hub=hub, name=name, progress=True)
    console().print(Text(f"{result.rows} rollouts in {result.uploaded} new shard(s) ({result.skipped} already there) "
                          f"-> {result.ref}"), soft_wrap=True)
    console().print(Text(f"stream them: load_dataset(<repo>, {result.name!r}, split='train', streaming=True) "
                          f"or hubgym score {result.ref}"), soft_wrap=True)
