"""Which builder an env name means: built-ins by name, family envs by prefix, third-party envs by entry point.

    builder_by_name("arithmetic")       # built-in
    builder_by_name("rg_leg_counting")  # a family env: the family owning the prefix "rg_" is the only one imported
    builder_by_name("my_env")           # a package exposing [project.entry-points."hubgym.envs"] my_env = "pkg.mod:B"
    load_builder_file(Path("envs/my_env/builder.py"))   # a builder file

What a user typed is parsed by hubgym.envs.refs (names, versioned ids, paths, hub refs) and resolved by
hubgym.envs.resolve_env, which calls these.

Listing names (`env_names`, `is_registered`) reads family indexes and entry-point metadata only: it imports no
builder and no bridged package; this module imports TaskBuilder (and so datasets) only when it resolves one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from hubgym.builders.families import EnvFamily, FamilyEnv, unknown_env, validate_entries
from hubgym.errors import EnvNotFoundError

if TYPE_CHECKING:
    from hubgym.builders.base import TaskBuilder

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

FAMILIES: dict[str, str] = {
    "reasoning_gym": "hubgym.bridges.reasoning_gym:FAMILY",
    "textarena": "hubgym.bridges.textarena:FAMILY",
    "openspiel": "hubgym.bridges.openspiel:FAMILY",
    "gymnasium": "hubgym.bridges.gymnasium:FAMILY",
}
"""Env families (many envs bridged from one package), as lazy `module:OBJECT` strings; see hubgym.builders.families."""

FAMILY_PREFIXES: dict[str, str] = {"reasoning_gym": "rg_", "textarena": "ta_", "openspiel": "os_", "gymnasium": "gym_"}
"""The name prefix each family owns, known without importing it: a name is looked up in one family only.
Every key of FAMILIES has one here, and it must equal the family object's `prefix`."""

BUILTIN = "builtin"
ENTRY_POINT = "entry point"
"""Sources of an env besides a family's name (the catalog's `source` column, `hubgym envs --source`)."""

def env_names(source: str | None = None) -> list[str]:
    """Every environment name known by name: built-ins, then each family's envs, then installed entry points.
    `source` keeps one part: "builtin", a family name, or "entry point". A family that fails to load adds none
    (`hubgym envs` shows its error)."""
    names = list(BUILTIN_ENVS) if source in (None, BUILTIN) else []
    for family in FAMILIES:
        if source in (None, family):
            names += [entry.name for entry in family_entries_or_none(family) or []]
    if source in (None, ENTRY_POINT):
        taken = set(names) | set(BUILTIN_ENVS)
        names += sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in taken)
    return names


def sources() -> list[str]:
    """Every value `env_names(source=...)` and `hubgym envs --source` accept."""
    return [BUILTIN, *FAMILIES, ENTRY_POINT]


# -- families ----------------------------------------------------------------------------------

def load_family(name: str) -> EnvFamily:
    """The registered family object (imports its module, which must not import the bridged package)."""
    if name not in FAMILIES:
        raise EnvNotFoundError(f"no env family named {name!r}; registered: {', '.join(FAMILIES)}")
    return _load_family(FAMILIES[name], FAMILY_PREFIXES.get(name))


def family_entries(name: str) -> list[FamilyEnv]:
    """A family's catalog rows, from its shipped index (cached; no import of the bridged package)."""
    load_family(name)  # an unknown family name is an EnvNotFoundError naming the registered ones
    return list(_family_entries(FAMILIES[name], FAMILY_PREFIXES.get(name)))


def family_entries_or_none(name: str) -> list[FamilyEnv] | None:
    """A family's rows, or None when its module or index fails to load (listing goes on without it)."""
    try:
        return family_entries(name)
    except Exception:  # reported by the catalog, which shows the error; here the family just has no names
        return None


def family_for(name: str) -> str | None:
    """The family whose prefix `name` starts with (the longest such prefix), or None."""
    owners = [family for family, prefix in FAMILY_PREFIXES.items() if family in FAMILIES and name.startswith(prefix)]
    return max(owners, key=lambda family: len(FAMILY_PREFIXES[family]), default=None)


@cache
def _load_family(target: str, prefix: str | None) -> EnvFamily:
    module, _, attr = target.partition(":")
    family = getattr(importlib.import_module(module), attr)
    for needed in ("name", "prefix", "entries", "builder"):
        if not hasattr(family, needed):
            raise EnvNotFoundError(f"{target} is {family!r}, which has no {needed!r}; a family implements "
                                   f"hubgym.builders.families.EnvFamily")
    if prefix is not None and family.prefix != prefix:
        raise EnvNotFoundError(f"{target} has prefix {family.prefix!r}, but the registry routes {prefix!r} to it; "
                               f"make FAMILY_PREFIXES and the family agree")
    return family


@cache
def _family_entries(target: str, prefix: str | None) -> tuple[FamilyEnv, ...]:
    family = _load_family(target, prefix)
    return tuple(validate_entries(family, list(family.entries())))


def _family_builder(family_name: str, name: str) -> type[TaskBuilder] | None:
    """The builder of a family env; None when the name is not in the family (an entry point may still have it)."""
    try:
        known = [entry.name for entry in family_entries(family_name)]
    except Exception as exc:
        raise EnvNotFoundError(f"env {name!r} belongs to family {family_name!r} ({FAMILIES[family_name]}), which "
                               f"failed to load: {type(exc).__name__}: {exc}. `hubgym envs --source {family_name}` "
                               f"shows the error") from exc
    if name not in known:
        return None
    return _check_builder(load_family(family_name).builder(name), f"{FAMILIES[family_name]}.builder({name!r})")


# -- resolving -----------------------------------------------------------------------------------

def is_registered(name: str) -> bool:
    """A built-in, family or installed entry-point env name (no version: hubgym.envs.refs splits it off)."""
    family = family_for(name)
    in_family = family is not None and name in {e.name for e in family_entries_or_none(family) or []}
    return name in BUILTIN_ENVS or in_family or any(True for _ in entry_points(group=ENTRY_POINT_GROUP, name=name))


def builder_by_name(name: str) -> type[TaskBuilder]:
    """The builder of a registered env name; EnvNotFoundError naming the known ones (or the closest) otherwise."""
    if name in BUILTIN_ENVS:
        return _load_target(BUILTIN_ENVS[name])
    family = family_for(name)
    builder = _family_builder(family, name) if family is not None else None
    if builder is not None:
        return builder
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        return _check_builder(ep.load(), f"entry point {ep.value!r}")
    if family is not None:
        raise unknown_env(name, family, [entry.name for entry in family_entries(family)])
    raise EnvNotFoundError(f"no environment named {name!r}; known: {_known_summary()}. "
                           f"Give a built-in or family env name, an installed '{ENTRY_POINT_GROUP}' entry point, "
                           f"or a path to a folder with builder.py")


def _known_summary() -> str:
    """Built-in and entry-point names in full; each family as one `prefix*` item (a family lists ~100 envs)."""
    families = [f"{FAMILY_PREFIXES.get(f, f + ':')}* (`hubgym envs --source {f}`)" for f in FAMILIES]
    return ", ".join([*env_names(BUILTIN), *families, *env_names(ENTRY_POINT)])


def _load_target(target: str) -> type[TaskBuilder]:
    module, _, attr = target.partition(":")
    return _check_builder(getattr(importlib.import_module(module), attr), target)


def load_builder_file(path: Path) -> type[TaskBuilder]:
    """Import a builder module from a file and return its single TaskBuilder subclass."""
    from hubgym.builders.base import TaskBuilder

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
    from hubgym.builders.base import TaskBuilder

    if not (inspect.isclass(obj) and issubclass(obj, TaskBuilder)):
        raise EnvNotFoundError(f"{origin} is {obj!r}, not a hubgym.TaskBuilder subclass")
    return obj
