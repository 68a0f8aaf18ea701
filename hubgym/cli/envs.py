"""`hubgym envs`, `init`, `build`, `check` and `push`: environments, from the catalog to a hub.

    hubgym envs                               # the catalog (fast: builds nothing)
    hubgym envs 'rg_*' --tag math --format names   # a slice of it, one name a line, for scripts
    hubgym init my_env --dir envs             # scaffold envs/my_env/ that passes `hubgym check` as is
    hubgym build arithmetic --config all      # every config's splits as Parquet under out/arithmetic/
    hubgym check ./envs/my_env                # conformance; exit code 1 when any check fails
    hubgym check all --jobs 4                 # the whole catalog, 4 envs at a time (--source/--tag: a slice)
    hubgym push arithmetic my-org/arithmetic  # one new hub revision: data, card, verifier, manifest
"""

from __future__ import annotations

import json
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.text import Text

from hubgym.app import views
from hubgym.cli.app import HUB_HELP, app, console, fail, user_errors
from hubgym.errors import HubgymError

if TYPE_CHECKING:
    from hubgym.conformance.context import Configs
    from hubgym.builders.base import TaskBuilder


class FileFormat(str, Enum):
    parquet = "parquet"
    arrow = "arrow"


class Kind(str, Enum):
    single_turn = "single_turn"
    tool_use = "tool_use"
    multi_turn = "multi_turn"


class ListFormat(str, Enum):
    table = "table"
    json = "json"
    names = "names"


SOURCE_HELP = ("only envs from this source: 'builtin', a family (reasoning_gym, textarena, openspiel, gymnasium), or "
               "'entry point'")
TAG_HELP = "only envs with this tag (repeatable: every tag given must match)"


@app.command()
@user_errors
def envs(pattern: Annotated[Optional[str], typer.Argument(help="only names holding this text, or matching this "
                                                                "glob (rg_*, *sort*)")] = None,
         kind: Annotated[Optional[Kind], typer.Option(help="only envs of this interaction kind")] = None,
         source: Annotated[Optional[str], typer.Option(help=SOURCE_HELP)] = None,
         tag: Annotated[Optional[list[str]], typer.Option(help=TAG_HELP)] = None,
         fmt: Annotated[ListFormat, typer.Option("--format", help="table for people; json (one object per env, "
                                                 "failed ones with 'error') or names (one a line) for scripts")]
         = ListFormat.table) -> None:
    """List the catalog (built-ins, env families, then installed `hubgym.envs` entry points) without building any."""
    from hubgym.envs.catalog import catalog

    entries = catalog(source=_known_source(source), kind=kind.value if kind else None, tags=tag or (), pattern=pattern)
    if fmt is ListFormat.json:
        typer.echo("[\n" + ",\n".join(json.dumps(asdict(e)) for e in entries) + "\n]")  # one env a line
    elif fmt is ListFormat.names:
        for e in entries:
            if e.error:
                console(stderr=True).print(Text(f"{e.name}: {e.error}", style="red"), soft_wrap=True)
            else:
                typer.echo(e.name)
    else:
        out = console()
        out.print(views.catalog_table(entries, width=out.width))


def _known_source(source: str | None) -> str | None:
    from hubgym.builders.registry import sources

    if source is not None and source not in sources():
        fail(f"--source {source!r} is not a source of envs; give one of: {', '.join(sources())}")
    return source


@app.command()
@user_errors
def init(name: Annotated[str, typer.Argument(help="env name: a lowercase Python identifier, e.g. count_vowels")],
         parent: Annotated[Path, typer.Option("--dir", help="folder to create NAME/ in")] = Path("."),
         kind: Annotated[Kind, typer.Option(help="interaction kind of the example env")] = Kind.single_turn) -> None:
    """Scaffold a working env of one kind (builder, verifier, golden cases, README, tests) in DIR/NAME/."""
    from hubgym.authoring.scaffold import scaffold_env

    folder = scaffold_env(name, parent, kind.value)
    files = ", ".join(sorted(p.name for p in folder.iterdir()))
    console().print(Text(f"created {folder}/: {files}", style="green"), soft_wrap=True)
    console().print(Text(f"next: hubgym check {folder}   then   pytest {folder}"), soft_wrap=True)


@app.command()
@user_errors
def build(env: Annotated[str, typer.Argument(help="env name, versioned id, or path to an env folder")],
          config: Annotated[Optional[str], typer.Option(help="config to build; 'all' = every config "
                                                        "[default: the first]")] = None,
          out: Annotated[Optional[Path], typer.Option(help="output folder [default: out/ENV]")] = None,
          fmt: Annotated[FileFormat, typer.Option("--format", help="file format")] = FileFormat.parquet) -> None:
    """Write an env's tasks as files: OUT/CONFIG/<env>-<split>.<format>, one set per config."""
    from hubgym.envs import build_files, resolve_env

    builder = resolve_env(env)
    out = out or Path("out") / builder.ENV
    with console().status(f"building {builder.env_id()}"):
        files = [f for name in config_names(builder, config) for f in build_files(builder, name, out, fmt.value)]
    console().print(views.files_table(files, title=f"{builder.env_id()}: {len(files)} files written under {out}"))


@app.command()
@user_errors
def check(target: Annotated[Optional[str], typer.Argument(help="env name, path to an env folder (or a folder of env "
                                                              "folders), or 'all' (the default with --source/--tag)")]
          = None,
          config: Annotated[Optional[str], typer.Option(help="one env: check only this config [default: every "
                                                        "config]; several envs: 'all' checks every config of each "
                                                        "[default: each env's default config]")] = None,
          max_rows: Annotated[Optional[int], typer.Option(min=1, help="one env: rows per split scored (every row is "
                                                            "built) [default: 200]; several envs: rows per split "
                                                            "built and scored [default: 50]")] = None,
          source: Annotated[Optional[str], typer.Option(help=SOURCE_HELP + " (with 'all')")] = None,
          tag: Annotated[Optional[list[str]], typer.Option(help=TAG_HELP + " (with 'all')")] = None,
          jobs: Annotated[Optional[int], typer.Option(min=1, help="envs checked at once, each in its own process "
                                                      "(default: the CPUs other work leaves free)")] = None,
          timeout: Annotated[float, typer.Option(min=1, help="seconds one env's checks may take when several envs "
                                                 "are checked; past it the env is one failure row")] = 900.0) -> None:
    """Run the conformance checks; print a table, then every failure in full. Exit code 1 on any failure.

    Many envs (all, a slice, a folder) run in parallel, a process each: a crash or hang fails only that env."""
    if target is None and not (source or tag):
        fail("name what to check: an env, an env folder, or 'all' (or a slice of the catalog: --source / --tag)")
    if (source or tag) and target not in (None, "all"):
        fail(f"--source and --tag pick envs from the catalog; use them with 'all' or alone, not with {target!r}")
    broken: list = []  # failure rows of envs and families in the slice that failed to load
    if target in (None, "all"):
        _only_all(config, "`hubgym check ENV --config C`, or `hubgym check all [--config all]`")
        names, broken = _catalog_slice(source, tag or [])
    elif Path(target).is_dir() and not (Path(target) / "builder.py").is_file():  # a folder of env folders
        names = _env_folders(target, config)
    else:
        _validate_target(target, config)
        return report(_check_one(target, None if config in (None, "all") else [config], max_rows or ONE_ENV_ROWS))
    # Proportionate: 103 envs with every config at full size would take hours on 2 cores. Each env's default
    # config (what loading it without a config builds), a few rows per split; --config all and --max-rows for more.
    from hubgym.conformance.context import Only

    configs = None if config == "all" else Only.DEFAULT
    rows = max_rows or MANY_ENVS_ROWS
    report(broken + (_check_in_parallel(names, configs, rows, jobs, timeout) if names else []))


ONE_ENV_ROWS = 200  # one env: rows scored per split, every row built
MANY_ENVS_ROWS = 50  # several envs: rows built and scored per split


def _catalog_slice(source: str | None, tags: list[str]) -> tuple[list[str], list]:
    """Names of the catalog's envs from `source` with every tag, and a failure row for each env or family in
    that slice that failed to load (a broken family cannot be checked, and must not pass silently)."""
    from hubgym.envs.catalog import catalog
    from hubgym.conformance import CheckResult

    entries = catalog(source=_known_source(source), tags=tags)
    if not entries:
        fail(f"no env matches --source {source} --tag {' --tag '.join(tags)}; list them with `hubgym envs`")
    broken = [CheckResult(e.name, "load", False, f"load: {e.error} [env={e.name!r}]. Fix: `hubgym envs --source "
                          f"{e.source}` shows it; fix or install what the error names", 0.0)
              for e in entries if e.error]
    return [e.name for e in entries if not e.error], broken


def _check_one(target: str, configs: list[str] | None, max_rows: int) -> list:
    """One env, in this process, a progress step per check."""
    from hubgym.conformance import CHECKS, iter_checks

    return views.with_progress(console(), [target], lambda name: iter_checks(name, configs=configs,
                                                                             max_rows=max_rows), steps=len(CHECKS))


def _check_in_parallel(names: list[str], configs: Configs, max_rows: int, jobs: int | None, timeout: float) -> list:
    """Many envs, `jobs` processes at a time; the bar counts finished envs and names each check as it finishes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from hubgym.conformance.parallel import check_many, default_jobs

    jobs = jobs or default_jobs()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("envs"), TimeElapsedColumn())
    out, finished = console(), []

    def done(name: str) -> None:
        progress.update(bar, advance=1)
        finished.append(name)
        if not out.is_terminal:  # a log file gets no bar: a line per env, so a long run shows how far it got
            out.print(f"checked {len(finished)} of {len(names)} envs: {name}", soft_wrap=True)

    with Progress(*columns, console=out, transient=True) as progress:
        bar = progress.add_task(f"checking {len(names)} envs, {jobs} at a time", total=len(names))
        results = check_many(names, jobs=jobs, timeout=timeout, configs=configs, max_rows=max_rows, build_rows=max_rows,
                             on_result=lambda r: progress.update(bar, description=f"{r.env}: {r.check} done"),
                             on_done=done)
    return results

@app.command()
@user_errors
def push(env: Annotated[str, typer.Argument(help="env name, versioned id, or path to an env folder")],
         repo: Annotated[str, typer.Argument(help="dataset repo id, e.g. my-org/arithmetic")],
         config: Annotated[Optional[list[str]], typer.Option(help="configs to push (repeatable) [default: all]")]
         = None,
         hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None) -> None:
    """Push an env (data files, dataset card, verifier, manifest) to a hub repo as one new revision."""
    from hubgym.envs import push_env

    with console().status(f"building and pushing {env} to {repo}"):
        result = push_env(env, repo, hub=hub, configs=config)
    python, cli = result.load_hints()  # they name the hub unless it is the default one
    console().print(Text(f"pushed {len(result.files)} files to {result.location} at revision {result.revision}"),
                    soft_wrap=True)
    console().print(Text(f"load it with: {python}"), soft_wrap=True)
    console().print(Text(f"sample it with: hubgym rollout {result.ref} {cli}"), soft_wrap=True)


def config_names(builder: type[TaskBuilder], config: str | None) -> list[str]:
    """The configs a command acts on: the first by default, every one for 'all'; unknown names are refused."""
    known = builder.config_names()
    if config is None or config == "all":
        return known if config else known[:1]
    if config not in known:
        raise builder.no_config(config, f"pass --config with one of: {', '.join(known)} (or 'all')")
    return [config]


def _env_folders(folder: str, config: str | None) -> list[str]:
    from hubgym.conformance.discover import env_folders

    found = [path for path, _ in env_folders(folder)]
    if not found:
        fail(f"{folder} holds no env: neither it nor any folder below it has builder.py (hubgym init NAME makes one)")
    _only_all(config, f"`hubgym check ENV_FOLDER --config C` on one of: {', '.join(found)}")
    return found


def _only_all(config: str | None, how: str) -> None:
    """Several envs share no config name but 'all' (every config of each): any other is refused, saying `how`."""
    if config not in (None, "all"):
        fail(f"--config {config} names one env's config; with several envs only --config all is known; run {how}")


def _validate_target(target: str, config: str | None) -> None:
    """An unknown env or config is a user error, raised before any work; a builder that fails to import
    is not: the checker reports it as a failed check, with the cause."""
    from hubgym.envs import resolve_env
    from hubgym.envs.refs import parse_ref

    try:
        builder = resolve_env(target)
    except HubgymError:
        raise
    except Exception:  # reported by the checks (check_declaration / load)
        return
    named = parse_ref(target).config  # ENV:CONFIG names the config as --config does
    if named is not None and config not in (None, named):
        fail(f"{target!r} names config {named!r} and --config {config!r}: name it once")
    config_names(builder, config or named)


def report(results: list, show_table: bool = True) -> None:
    """The checks table, every failure message in full, a one-line verdict; exit code 1 on any failure."""
    if show_table:
        console().print(views.checks_table(results))
    if any(not r.ok for r in results):
        console().print(views.failures(results), soft_wrap=True)
    if any(r.failed for r in results):
        fail(views.checks_verdict(results))
    console().print(Text(views.checks_verdict(results), style="bold green"), soft_wrap=True)
