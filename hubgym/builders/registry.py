"""Find an environment's builder: built-ins by name, third-party envs by entry point, or a path.

    resolve_env("arithmetic")        # built-in (also "arithmetic-v1": the version must match)
    resolve_env("my_env")            # a package exposing  [project.entry-points."hubgym.envs"] my_env = "pkg.mod:Builder"
    resolve_env("./envs/my_env")     # a folder holding builder.py (or the .py file itself)
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from importlib.metadata import entry_points
from pathlib import Path

from hubgym.builders.base import TaskBuilder
from hubgym.errors import EnvNotFoundError

ENTRY_POINT_GROUP = "hubgym.envs"

BUILTIN_ENVS: dict[str, str] = {
    "arithmetic": "hubgym.builders.arithmetic:Arithmetic",
    "gsm8k": "hubgym.builders.gsm8k:GSM8K",
    "calc_tools": "hubgym.builders.calc_tools:CalcTools",
    "retail": "hubgym.builders.retail:Retail",
    "wordle": "hubgym.builders.wordle:Wordle",
    "tictactoe": "hubgym.builders.tictactoe:TicTacToe",
    "reverse_text": "hubgym.builders.reverse_text:ReverseText",
}
"""Built-in environments, as lazy `module:Class` strings (importing one env never imports the others)."""

_VERSIONED = re.compile(r"^(?P<name>.+)-v(?P<version>\d+)$")


def env_names() -> list[str]:
    """Every environment name known by name: built-ins, then installed entry points."""
    return list(BUILTIN_ENVS) + sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in BUILTIN_ENVS)


def resolve_env(ref: str | type[TaskBuilder]) -> type[TaskBuilder]:
    """The builder class for a name, versioned id, entry point or path."""
    if isinstance(ref, type) and issubclass(ref, TaskBuilder):
        return ref
    path = Path(ref)
    if path.suffix == ".py" or "/" in ref or ref.startswith(".") or (path.is_dir() and not is_registered(ref)):
        return load_builder_file(path / "builder.py" if path.is_dir() else path)
    name, version = _split_version(ref)
    builder = _by_name(name)
    if version is not None and builder.ENV_VERSION != version:
        raise EnvNotFoundError(f"env {name!r} is at version {builder.ENV_VERSION}, not {version}; "
                               f"use {builder.env_id()!r} or install the version you need")
    return builder


def is_registered(ref: str) -> bool:
    """A built-in or installed entry-point env (a name or versioned id). A bare word names a registered env
    first; a folder of that name is used only if none is registered."""
    name = _split_version(ref)[0]
    return name in BUILTIN_ENVS or any(True for _ in entry_points(group=ENTRY_POINT_GROUP, name=name))


def _split_version(ref: str) -> tuple[str, int | None]:
    match = _VERSIONED.match(ref)
    return (match["name"], int(match["version"])) if match else (ref, None)


def _by_name(name: str) -> type[TaskBuilder]:
    if name in BUILTIN_ENVS:
        return _load_target(BUILTIN_ENVS[name])
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        return _check_builder(ep.load(), f"entry point {ep.value!r}")
    raise EnvNotFoundError(f"no environment named {name!r}; known: {', '.join(env_names())}. "
                           f"Give a built-in name, an installed '{ENTRY_POINT_GROUP}' entry point, "
                           f"or a path to a folder with builder.py")


def _load_target(target: str) -> type[TaskBuilder]:
    module, _, attr = target.partition(":")
    return _check_builder(getattr(importlib.import_module(module), attr), target)


def load_builder_file(path: Path) -> type[TaskBuilder]:
    """Import a builder module from a file and return its single TaskBuilder subclass."""
    path = path.resolve()
    if not path.is_file():
        raise EnvNotFoundError(f"no builder file at {path}; an env folder holds builder.py, verifier.py, golden.jsonl "
                               f"(create one with `hubgym init NAME`)")
    name = f"hubgym_user_{path.parent.name}_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except BaseException:  # a half-run module must not be found by the next attempt
            del sys.modules[name]
            raise
    module = sys.modules[name]
    found = [c for c in vars(module).values()
             if inspect.isclass(c) and issubclass(c, TaskBuilder) and c is not TaskBuilder and c.__module__ == name]
    if len(found) != 1:
        raise EnvNotFoundError(f"{path} defines {len(found)} TaskBuilder subclasses; define exactly one")
    return _check_builder(found[0], str(path))


def _check_builder(obj: object, origin: str) -> type[TaskBuilder]:
    if not (inspect.isclass(obj) and issubclass(obj, TaskBuilder)):
        raise EnvNotFoundError(f"{origin} is {obj!r}, not a hubgym.TaskBuilder subclass")
    return obj
