"""`hubgym envs`, `init`, `build`, `check` and `push`: environments, from the catalog to a hub.

    hubgym envs                               # the catalog (fast: builds nothing)
    hubgym init my_env --dir envs             # scaffold envs/my_env/ that passes `hubgym check` as is
    hubgym build arithmetic --config all      # every config's splits as Parquet under out/arithmetic/
    hubgym check ./envs/my_env                # conformance; exit code 1 when any check fails
    hubgym push arithmetic my-org/arithmetic  # one new hub revision: data, card, verifier, manifest
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from hubgym import views
from hubgym.builders.base import TaskBuilder
from hubgym.cli.app import HUB_HELP, app, console, fail, user_errors
from hubgym.errors import EnvContractError, HubgymError, Where


class FileFormat(str, Enum):
    parquet = "parquet"
    arrow = "arrow"


class Kind(str, Enum):
    single_turn = "single_turn"
    tool_use = "tool_use"
    multi_turn = "multi_turn"


@app.command()
@user_errors
def envs() -> None:
    """List every known env (built-ins, then installed `hubgym.envs` entry points) without building any."""
    from hubgym.catalog import catalog

    console().print(views.catalog_table(catalog()))


@app.command()
@user_errors
def init(name: Annotated[str, typer.Argument(help="env name: a lowercase Python identifier, e.g. count_vowels")],
         parent: Annotated[Path, typer.Option("--dir", help="folder to create NAME/ in")] = Path("."),
         kind: Annotated[Kind, typer.Option(help="interaction kind of the example env")] = Kind.single_turn) -> None:
    """Scaffold a working env of one kind (builder, verifier, golden cases, README, tests) in DIR/NAME/."""
    from hubgym.scaffold import scaffold_env

    folder = scaffold_env(name, parent, kind.value)
    console().print(Text(f"created {folder}/: " + ", ".join(sorted(p.name for p in folder.iterdir())), style="green"))
    console().print(Text(f"next: hubgym check {folder}   then   pytest {folder}"))


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
    with console().status(f"building {builder.env_id()}"):
        files = [f for name in config_names(builder, config) for f in build_files(builder, name, out, fmt.value)]
    console().print(views.files_table(files, title=f"{builder.env_id()}: {len(files)} files written under {out}"))


@app.command()
@user_errors
def check(target: Annotated[str, typer.Argument(help="env name, path to an env folder (or a folder of env folders), "
                                                     "or 'all'")],
          config: Annotated[Optional[str], typer.Option(help="check only this config (one env only) "
                                                        "[default: every config]")] = None,
          max_rows: Annotated[int, typer.Option(min=1, help="rows per split to check")] = 200) -> None:
    """Run the conformance checks; print a table, then every failure in full. Exit code 1 on any failure."""
    from hubgym.builders import env_names

    if target == "all":
        if config:
            fail("--config names one env's config; run `hubgym check ENV --config C`, or `hubgym check all` alone")
        names, configs = env_names(), None
    elif Path(target).is_dir() and not (Path(target) / "builder.py").is_file():  # a folder of env folders
        names, configs = _env_folders(target, config), None
    else:
        _validate_target(target, config)
        names, configs = [target], None if config in (None, "all") else [config]
    from hubgym.conformance import CHECKS, iter_checks  # iter_checks: check_env, one result at a time

    results = views.with_progress(console(), names,
                                  lambda name: iter_checks(name, configs=configs, max_rows=max_rows),
                                  steps=len(CHECKS))
    report(results)


@app.command()
@user_errors
def push(env: Annotated[str, typer.Argument(help="env name, versioned id, or path to an env folder")],
         repo: Annotated[str, typer.Argument(help="dataset repo id, e.g. my-org/arithmetic")],
         config: Annotated[Optional[list[str]], typer.Option(help="configs to push (repeatable) [default: all]")]
         = None,
         hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None) -> None:
    """Push an env (data files, dataset card, verifier, manifest) to a hub repo as one new revision."""
    from hubgym.hub import push_env

    with console().status(f"building and pushing {env} to {repo}"):
        result = push_env(env, repo, hub=hub, configs=config)
    python, cli = result.load_hints()  # they name the hub unless it is the default one
    console().print(Text(f"pushed {len(result.files)} files to {result.location} at revision {result.revision}"))
    console().print(Text(f"load it with: {python}"))
    console().print(Text(f"sample it with: hubgym rollout {result.ref} {cli}"))


def config_names(builder: type[TaskBuilder], config: str | None) -> list[str]:
    """The configs a command acts on: the first by default, every one for 'all'; unknown names are refused."""
    known = builder.config_names()
    if config is None or config == "all":
        return known if config else known[:1]
    if config not in known:
        raise EnvContractError(f"env {builder.ENV!r} has no config {config!r}", Where(env=builder.ENV, config=config),
                               f"pass --config with one of: {', '.join(known)} (or 'all')")
    return [config]


def _env_folders(folder: str, config: str | None) -> list[str]:
    from hubgym.conformance.discover import env_folders

    found = [path for path, _ in env_folders(folder)]
    if not found:
        fail(f"{folder} holds no env: neither it nor any folder below it has builder.py (hubgym init NAME makes one)")
    if config:
        fail(f"--config names one env's config; run `hubgym check ENV_FOLDER --config C` on one of: {', '.join(found)}")
    return found


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
        console().print(views.checks_table(results))
    bad = [r for r in results if not r.ok]
    if bad:
        console().print(views.failures(results), soft_wrap=True)
        fail(f"{len(bad)} of {len(results)} checks failed")
    console().print(Text(f"all {len(results)} checks passed", style="bold green"))
