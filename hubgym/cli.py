"""The `hubgym` command: list, scaffold, build and check environments.

    hubgym envs                               # the catalog (fast: builds nothing)
    hubgym init my_env --dir envs             # scaffold envs/my_env/ that passes `hubgym check` as is
    hubgym build arithmetic --config all      # every config's splits as Parquet under out/arithmetic/
    hubgym check ./envs/my_env                # conformance; exit code 1 when any check fails
    hubgym demo                               # build and check every built-in env, then summarize

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
def demo(out: Annotated[Path, typer.Option(help="where the built envs are written")] = Path("out/demo"),
         max_rows: Annotated[int, typer.Option(min=1, help="rows per split to check")] = 100,
         env: Annotated[Optional[list[str]], typer.Option("--env", help="only these envs (repeatable) "
                                                          "[default: every built-in]")] = None) -> None:
    """Build every built-in env (first config), check each one, and print the catalog and a summary."""
    from hubgym.builders.registry import BUILTIN_ENVS
    from hubgym.catalog import catalog
    from hubgym.demo import demo_env

    names = env or list(BUILTIN_ENVS)
    _console().print(views.catalog_table(catalog(names)))
    summaries: list[views.EnvSummary] = []

    def one(name: str) -> list:
        summary, results = demo_env(name, out, max_rows)
        summaries.append(summary)
        return results

    results = views.with_progress(_console(), names, one, verb="building and checking")
    _console().print(views.summary_table(summaries))
    report(results, show_table=False)


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
