"""Which code runs for an env: the one place that turns an env reference into tasks and a verifier.

    load_env_tasks("arithmetic:easy", "test", 8)                     # a name the user typed: built-in or entry point
    load_env_tasks("./envs/my_env", "test", None)                    # a folder the user typed
    load_env_tasks("org/arith@3f1c2e9:easy", "test", None, pins={"org/arith": "sha256:..."})  # a hub env, pinned
    stored_env_verifier("arithmetic", where)                         # the env a stored row names: registered only

Two kinds of reference, one rule.

- What the user typed (a command-line argument, a training config, a Python call) may name any env: a
  built-in or installed entry-point name, a versioned id (`arithmetic-v1`), a folder or `.py` file, or a
  hub env `org/name[@revision]` whose verifier is pinned by sha256 or explicitly trusted.
- What stored data names (a row's `env`, a manifest, a card, `index.json`, `hubgym.json`, a revision
  string) never chooses code. A row's env picks only among verifiers the user chose: built-in and
  entry-point envs by name, `--verifier` modules given on the command line, and pinned or trusted hub
  revisions (hubgym.score.choice holds that choice). Anything else, a path above all, is one error
  that names the row's env value and the flag that would allow it.

rollout/, score/ and train/ resolve envs only through this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hubgym.builders.base import TaskBuilder
from hubgym.builders.registry import is_registered, resolve_env
from hubgym.errors import EnvContractError, EnvNotFoundError, ToolNotFoundError, Where
from hubgym.schemas.tasks import Task
from hubgym.verifiers.contract import Verifier

__all__ = ["EnvTasks", "check_task_tools", "hub_verifier", "is_hub_ref", "load_env_tasks", "mixture_of",
           "resolve_env", "split_spec", "stored_env_verifier"]

STORED_ENV_FLAGS = "--verifier ENV=MODULE (a verifier module you name) or --env-revision ORG/NAME@REVISION (pinned)"


@dataclass
class EnvTasks:
    """One env's tasks of one split, with the verifier that scores them."""

    env: str
    config: str
    verifier: Verifier
    tasks: list[Task]
    repo: str | None = None  # set when the env was loaded from a hub: recorded in every row's provenance
    revision: str | None = None


def split_spec(spec: str) -> tuple[str, str | None]:
    """`ENV[:CONFIG]` -> (ENV, CONFIG or None). A hub ref's `@revision` stays with ENV."""
    ref, _, config = spec.partition(":")
    return ref, config or None


def is_hub_ref(ref: str) -> bool:
    """`org/name[@revision]` that is not a local folder or file."""
    return "/" in ref.split("@", 1)[0] and not Path(ref).exists() and not ref.startswith((".", "/", "~"))


def load_env_tasks(spec: str, split: str, limit: int | None, *, hub: str | None = None, trust: bool = False,
                   pins: dict[str, str] | None = None) -> EnvTasks:
    """Build (or load from a hub) one env's tasks, the user's `ENV[:CONFIG]`, and check every row's tools exist
    before any generation."""
    ref, config = split_spec(spec)
    if is_hub_ref(ref):
        from hubgym.hub.load import load_env

        loaded = load_env(ref, trust=trust, pin=(pins or {}).get(ref.split("@")[0]), config=config, split=split,
                          hub=hub)
        name, config, verifier, rows = loaded.env, loaded.config, loaded.verifier, loaded.tasks
        repo, revision = loaded.repo, loaded.revision
    else:
        builder = resolve_env(ref)
        config = _known_config(builder, config)
        name, verifier, rows, repo, revision = builder.ENV, builder.verifier(), _split(builder, config, split), None, None
    tasks = [rows[i] for i in range(min(limit or len(rows), len(rows)))]
    _check_tools(tasks, Where(name, config, split))
    return EnvTasks(name, config, verifier, tasks, repo, revision)


def _known_config(builder: type[TaskBuilder], config: str | None) -> str:
    known = builder.config_names()
    if config is None:
        return known[0]
    if config not in known:
        raise EnvContractError(f"env {builder.ENV!r} has no config {config!r}", Where(env=builder.ENV, config=config),
                               f"write ENV:CONFIG with one of its configs: {', '.join(known)}")
    return config


def _split(builder: type[TaskBuilder], config: str, split: str):
    from hubgym.builders.build import build_tasks

    splits = build_tasks(builder, config)
    if split not in splits:
        raise EnvContractError(f"env {builder.ENV!r} config {config!r} has no split {split!r}",
                               Where(env=builder.ENV, config=config, split=split),
                               f"choose one of its splits: {', '.join(splits)}")
    return splits[split]


def check_task_tools(tasks: list[Task], where: Where) -> None:
    """Every tool the rows offer is registered; else one error naming env, config, split, row and field."""
    _check_tools(tasks, where)


def _check_tools(tasks: list[Task], where: Where) -> None:
    from hubgym.tools.registry import get_tool

    for task in tasks:
        for tool_name in task["interaction"]["tools"]:
            try:
                get_tool(tool_name)
            except ToolNotFoundError as exc:
                at = Where(where.env, where.config, where.split, task["id"], "interaction.tools")
                raise ToolNotFoundError(f"{exc} [{at}]") from None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(-v\d+)?")


def stored_env_verifier(env: object, where: Where | None = None) -> Verifier:
    """The current verifier of an env that stored data names: a built-in or installed entry-point env only.

    A path, a hub ref or any other value is refused without importing anything; the message names the value
    and the flags that let the user choose a verifier for those rows.
    """
    at = f" [{where}]" if where is not None else ""
    name = env if isinstance(env, str) and _ENV_NAME.fullmatch(env) else None
    flags = STORED_ENV_FLAGS.replace("ENV", name or "ENV", 1)
    if name is not None and is_registered(name):
        try:
            return resolve_env(name).verifier()
        except EnvNotFoundError as exc:  # a versioned id of another version
            raise EnvNotFoundError(f"rows name env {name!r}{at}: {exc}. Or choose a verifier for these rows: "
                                   f"{flags}") from None
    raise EnvNotFoundError(f"rows name env {repr(env)[:200]}{at}, which is not a built-in or installed env; stored "
                           f"data never chooses which code runs, so no verifier is loaded for it. Choose one for these "
                           f"rows: {flags}")


def hub_verifier(ref: str, *, trust: bool, pin: str | None, hub) -> tuple[str, Verifier, str]:
    """(env, verifier, "org/name@<commit>") of a hub env revision the user named: its metadata only, no task data.

    The same steps as `load_env` up to the verifier, so the same pin/trust rules apply.
    """
    from hubgym.hub.base import get_hub, hub_argument, parse_ref
    from hubgym.hub.manifest import METADATA_FILES, read_manifest
    from hubgym.hub.trust import load_hub_verifier

    repo, revision = parse_ref(ref)
    backend = get_hub(hub)
    meta = backend.resolve(repo, revision, patterns=METADATA_FILES)
    pinned = f"{repo}@{meta.revision}"
    manifest = read_manifest(meta.path, pinned)
    verifier = load_hub_verifier(meta.path, manifest, pinned, trust=trust, pin=pin, hub=hub_argument(backend))
    return manifest["env"], verifier, pinned


def mixture_of(specs: list[tuple[str, float]], split: str, seed: int = 0, **options):
    """A lazy task source over `ENV[:CONFIG]` specs with weights: a `hubgym.mixture.Mixture`, whose env configs
    are opened (rows generated or streamed, never built whole) only when a task of theirs is drawn.

        mix = mixture_of([("arithmetic:easy", 1.0), ("wordle", 2.0)], "train", seed=0)
        batch = mix.take(64)
    """
    from hubgym.mixture import Mixture, parse_spec

    spec = parse_spec([{"name": name, "weight": weight} for name, weight in specs])
    return Mixture.from_spec(spec, split=split, seed=seed, **options)
