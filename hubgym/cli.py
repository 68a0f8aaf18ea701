"""The `hubgym` command: list, scaffold, build and check environments.

    hubgym envs                               # the catalog (fast: builds nothing)
    hubgym init my_env --dir envs             # scaffold envs/my_env/ that passes `hubgym check` as is
    hubgym build arithmetic --config all      # every config's splits as Parquet under out/arithmetic/
    hubgym check ./envs/my_env                # conformance; exit code 1 when any check fails
    hubgym demo                               # the main job: model, envs, hub, rollouts, re-score, GRPO

User errors (an unknown env, a bad name, a builder that breaks the contract) print one red message
and exit with code 1; a traceback means a bug in hubgym or in the env's code.
"""

from __future__ import annotations

import functools
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, NoReturn, Optional

import typer
from rich.console import Console
from rich.text import Text

from hubgym import cli_views as views
from hubgym.builders.base import TaskBuilder
from hubgym.errors import EnvContractError, HubgymError, Where

app = typer.Typer(name="hubgym", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="RL environments for language models as plain data: list, scaffold, build and check envs.")


def _console(stderr: bool = False) -> Console:
    """A console on the current stream; piped output (CI logs, files) renders 160 wide instead of rich's 80."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, width=width)


class FileFormat(str, Enum):
    parquet = "parquet"
    arrow = "arrow"


def fail(message: str) -> NoReturn:
    _console(stderr=True).print(Text.assemble(("error: ", "bold red"), (message, "red")), soft_wrap=True)
    raise typer.Exit(1)


def user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Show hubgym errors and failed dataset builds (with the builder's own error) as one red line."""
    from datasets.exceptions import DatasetGenerationError

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (HubgymError, DatasetGenerationError) as exc:
            fail(views.error_text(exc))
    return run


@app.callback()
def _quiet_datasets() -> None:
    """datasets' own progress bars and logs would interleave with ours."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


@app.command()
@user_errors
def envs() -> None:
    """List every known env (built-ins, then installed `hubgym.envs` entry points) without building any."""
    from hubgym.catalog import catalog

    _console().print(views.catalog_table(catalog()))


@app.command()
@user_errors
def init(name: Annotated[str, typer.Argument(help="env name: a lowercase Python identifier, e.g. count_vowels")],
         parent: Annotated[Path, typer.Option("--dir", help="folder to create NAME/ in")] = Path(".")) -> None:
    """Scaffold a working single_turn env (builder, verifier, golden cases, README, test) in DIR/NAME/."""
    from hubgym.scaffold import scaffold_env

    folder = scaffold_env(name, parent)
    _console().print(Text(f"created {folder}/: " + ", ".join(sorted(p.name for p in folder.iterdir())), style="green"))
    _console().print(Text(f"next: hubgym check {folder}   then   pytest {folder}"))


@app.command()
@user_errors
def build(env: Annotated[str, typer.Argument(help="env name, versioned id, or path to an env folder")],
          config: Annotated[Optional[str], typer.Option(help="config to build; 'all' = every config "
                                                        "[default: the first]")] = None,
          out: Annotated[Optional[Path], typer.Option(help="output folder [default: out/ENV]")] = None,
          fmt: Annotated[FileFormat, typer.Option("--format", help="file format")] = FileFormat.parquet) -> None:
    """Write an env's tasks as files: OUT/CONFIG/<env>-<split>.<format>, one set per config."""
    from hubgym.builders import build_files, resolve_env

    builder = resolve_env(env)
    out = out or Path("out") / builder.ENV
    with _console().status(f"building {builder.env_id()}"):
        files = [f for name in config_names(builder, config) for f in build_files(builder, name, out, fmt.value)]
    _console().print(views.files_table(files, title=f"{builder.env_id()}: {len(files)} files written under {out}"))


@app.command()
@user_errors
def check(target: Annotated[str, typer.Argument(help="env name, path to an env folder, or 'all'")],
          config: Annotated[Optional[str], typer.Option(help="check only this config (one env only) "
                                                        "[default: every config]")] = None,
          max_rows: Annotated[int, typer.Option(min=1, help="rows per split to check")] = 200) -> None:
    """Run the conformance checks; print a table, then every failure in full. Exit code 1 on any failure."""
    from hubgym.builders import env_names

    if target == "all":
        if config:
            fail("--config names one env's config; run `hubgym check ENV --config C`, or `hubgym check all` alone")
        names, configs = env_names(), None
    else:
        _validate_target(target, config)
        names, configs = [target], None if config in (None, "all") else [config]
    from hubgym.conformance import CHECKS, iter_checks  # iter_checks: check_env, one result at a time

    results = views.with_progress(_console(), names,
                                  lambda name: iter_checks(name, configs=configs, max_rows=max_rows),
                                  steps=len(CHECKS))
    report(results)


@app.command()
@user_errors
def demo(out: Annotated[Path, typer.Option(help="where everything the job makes is written (wiped first)")]
         = Path("out/demo"),
         max_rows: Annotated[int, typer.Option(min=1, help="rows per split to check")] = 100,
         env: Annotated[Optional[list[str]], typer.Option("--env", help="only check these envs (repeatable) "
                                                          "[default: every built-in]")] = None,
         offline_steps: Annotated[int, typer.Option(min=0, help="GRPO steps on the stored rollouts")] = 20,
         online_steps: Annotated[int, typer.Option(min=0, help="GRPO steps on fresh rollouts")] = 100) -> None:
    """The main job: tiny model -> envs -> local hub -> vLLM rollouts -> re-score -> GRPO -> report."""
    from hubgym.pipeline import DemoSettings, run_demo

    settings = DemoSettings(out=out, check_envs=env, max_rows=max_rows, offline_steps=offline_steps,
                            online_steps=online_steps)
    report = run_demo(settings, _console())
    if report.checks_failed:
        fail(f"{report.checks_failed} conformance checks failed (see above)")


class EngineKind(str, Enum):
    vllm = "vllm"
    openai = "openai"


@app.command()
@user_errors
def rollout(
    envs: Annotated[list[str], typer.Argument(help="ENV or ENV:CONFIG (name, versioned id or folder), one or more")],
    model: Annotated[str, typer.Option(help="model folder (or name served at --base-url); 'tiny' makes a tiny "
                                            "local model")] = "tiny",
    engine: Annotated[EngineKind, typer.Option(help="vllm: offline engine in this process; openai: a server")]
    = EngineKind.vllm,
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
    max_model_len: Annotated[int, typer.Option(min=16, help="context length")] = 4096,
    shard_index: Annotated[int, typer.Option(min=0, help="this worker's index")] = 0,
    num_shards: Annotated[int, typer.Option(min=1, help="number of workers splitting the tasks")] = 1,
    hub: Annotated[Optional[str], typer.Option(help="where org/name@revision envs load from and --push goes: 'hf', "
                                                    "a Hub-API URL or a local hub folder [default: $HUBGYM_HUB]")]
    = None,
    trust: Annotated[bool, typer.Option(help="run hub envs' verifiers unpinned")] = False,
    pin: Annotated[Optional[list[str]], typer.Option(help="REPO=sha256:<hex>: the verifier a hub env must have "
                                                          "(repeatable)")] = None,
    push: Annotated[Optional[str], typer.Option(help="after the run, push its shards to this rollout repo "
                                                     "(org/name; the run id is the config)")] = None,
) -> None:
    """Sample rollouts with vLLM, score them, and write Arrow shards; then print a table per env."""
    from hubgym.rollout import RolloutConfig, SamplingArgs, run_rollouts, scan_rollouts, summarize
    from hubgym.rollout.tiny_model import default_tiny_model

    config = RolloutConfig(envs=envs, model=str(default_tiny_model()) if model == "tiny" else model, out=str(out),
                           engine=engine.value, base_url=base_url, mode=mode, n=n, limit=limit, split=split,
                           sampling=SamplingArgs(temperature=temperature, max_tokens=max_tokens, seed=seed),
                           max_model_len=max_model_len, shard_index=shard_index, num_shards=num_shards, hub=hub,
                           trust=trust, pins=_pins(pin or []))
    try:
        summary = run_rollouts(config)
    except KeyboardInterrupt:
        _console(stderr=True).print(f"[yellow]interrupted: the rollouts stored in {out} stay; the same command resumes "
                                    f"(no rollout sampled twice or left out)")
        raise typer.Exit(130)
    _console().print(views.frame_table(summarize(scan_rollouts([out])), title=f"run {summary.run_id}: {out}"))
    _console().print(Text(f"{summary.written} rollouts written ({summary.skipped} already stored) in "
                          f"{summary.seconds:.1f}s, {summary.generated_tokens / max(summary.seconds, 1e-9):,.0f} "
                          f"generated tokens/s; shards in {out / 'shards'}"))
    if push:
        from hubgym.hub.rollouts import push_rollouts

        pushed = push_rollouts(out, push, hub=hub, progress=True)
        _console().print(Text(f"pushed {pushed.uploaded} shard(s) ({pushed.skipped} already there): {pushed.rows} "
                              f"rollouts -> {pushed.ref}"))


def _pins(pins: list[str]) -> dict[str, str]:
    """--pin REPO=sha256:<hex> (repeatable) -> {repo: pin}."""
    out = {}
    for item in pins:
        repo, eq, value = item.partition("=")
        if not eq or "/" not in repo:
            raise typer.BadParameter(f"--pin {item!r}: write REPO=sha256:<hex>, e.g. org/arith=sha256:9f2c... (the "
                                     f"refusal message of an unpinned run shows the sha256)")
        out[repo.split("@")[0]] = value
    return out


@app.command("report")
@user_errors
def report_rollouts(sources: Annotated[list[Path], typer.Argument(help="shard files or run folders")],
                    plot: Annotated[Optional[Path], typer.Option(help="PNG of rewards per env "
                                                                 "[default: SOURCE/rewards.png]")] = None) -> None:
    """Summarize stored rollouts per env (rewards, pass@1/pass@k, turns, truncation, tools, errors) + a PNG."""
    from hubgym.rollout import plot_rewards, scan_rollouts, summarize

    rollouts = scan_rollouts(sources)
    _console().print(views.frame_table(summarize(rollouts), title=f"rollouts in {', '.join(map(str, sources))}"))
    target = plot or (sources[0] if sources[0].is_dir() else sources[0].parent) / "rewards.png"
    _console().print(Text(f"plot: {plot_rewards(rollouts, target)}"))


@app.command()
@user_errors
def push(env: Annotated[str, typer.Argument(help="env name, versioned id, or path to an env folder")],
         repo: Annotated[str, typer.Argument(help="dataset repo id, e.g. my-org/arithmetic")],
         config: Annotated[Optional[list[str]], typer.Option(help="configs to push (repeatable) [default: all]")]
         = None,
         hub: Annotated[Optional[str], typer.Option(help="'hf' (the Hub at HF_ENDPOINT), a Hub-API URL, or a local "
                                                    "hub folder [default: $HUBGYM_HUB, else ~/.cache/hubgym/hub]")]
         = None) -> None:
    """Push an env (data files, dataset card, verifier, manifest) to a hub repo as one new revision."""
    from hubgym.hub import push_env

    with _console().status(f"building and pushing {env} to {repo}"):
        result = push_env(env, repo, hub=hub, configs=config)
    sha = result.manifest.get("verifier", {}).get("sha256", "")
    _console().print(Text(f"pushed {len(result.files)} files to {result.location} at revision {result.revision}"))
    _console().print(Text(f"load it with: hubgym.load_env({result.ref!r}, pin='sha256:{sha}')"))


def config_names(builder: type[TaskBuilder], config: str | None) -> list[str]:
    """The configs a command acts on: the first by default, every one for 'all'; unknown names are refused."""
    known = builder.config_names()
    if config is None or config == "all":
        return known if config else known[:1]
    if config not in known:
        raise EnvContractError(f"env {builder.ENV!r} has no config {config!r}", Where(env=builder.ENV, config=config),
                               f"pass --config with one of: {', '.join(known)} (or 'all')")
    return [config]


def _validate_target(target: str, config: str | None) -> None:
    """An unknown env or config is a user error, raised before any work; a builder that fails to import
    is not: the checker reports it as a failed check, with the cause."""
    from hubgym.builders import resolve_env

    try:
        builder = resolve_env(target)
    except HubgymError:
        raise
    except Exception:  # reported by the checks (check_declaration / load)
        return
    config_names(builder, config)


def report(results: list, show_table: bool = True) -> None:
    """The checks table, every failure message in full, a one-line verdict; exit code 1 on any failure."""
    if show_table:
        _console().print(views.checks_table(results))
    bad = [r for r in results if not r.ok]
    if bad:
        _console().print(views.failures(results), soft_wrap=True)
        fail(f"{len(bad)} of {len(results)} checks failed")
    _console().print(Text(f"all {len(results)} checks passed", style="bold green"))


def main() -> None:
    """Console-script entry point (`hubgym`)."""
    app()


from hubgym import cli_train as _cli_train  # noqa: E402,F401  (registers push-rollouts, score, replay, train)
