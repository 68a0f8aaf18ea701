"""Env families: many envs generated from one installed package, listed without importing it.

A family is a module-level object `FAMILY` (registered by dotted path in `hubgym.builders.registry.FAMILIES`)
with a name, a name prefix, `entries()` read from a JSON index shipped next to its module, and `builder(name)`,
which may import the bridged package and returns a cached TaskBuilder subclass.

    from hubgym.builders.families import FamilyEnv, load_index, write_index

    class _Family:
        name, prefix = "my_games", "mg_"
        def entries(self) -> list[FamilyEnv]:
            return load_index(INDEX, source=self.name)          # fast: no import of the games package
        def builder(self, name: str) -> type[TaskBuilder]:
            ...                                                  # may import the package; cache the class

    FAMILY = _Family()

The catalog (`hubgym envs`) and the registry (`resolve_env("mg_chess")`) only ever call `entries()` to list
and `builder(name)` of the one family whose prefix a name starts with.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from hubgym.errors import EnvNotFoundError
from hubgym.files import atomic_write_bytes

if TYPE_CHECKING:
    from hubgym.builders.base import TaskBuilder

KINDS = ("single_turn", "tool_use", "multi_turn")


@dataclass(frozen=True)
class FamilyEnv:
    """One catalog row of a family, known WITHOUT importing the family's package."""

    name: str  # the env name, a Python identifier: "rg_basic_arithmetic", "ta_sudoku"
    kind: str  # "single_turn" | "tool_use" | "multi_turn"
    configs: tuple[str, ...]  # config names, first = default (e.g. "easy", "medium", "hard")
    tags: tuple[str, ...]  # e.g. ("math", "arithmetic"): free-form lowercase words
    source: str  # the family's name, e.g. "reasoning_gym"
    description: str  # one line


@runtime_checkable
class EnvFamily(Protocol):
    """What the registry and the catalog need of a family."""

    name: str  # "reasoning_gym"
    prefix: str  # "rg_": every env name of the family starts with it

    def entries(self) -> list[FamilyEnv]:
        """Every env of the family, fast: read from a JSON index shipped in hubgym, no import of the package."""
        ...

    def builder(self, name: str) -> type[TaskBuilder]:
        """The builder class of one env (may import the package); the same class on every call.
        An unknown name raises hubgym.errors.EnvNotFoundError."""
        ...


# -- the JSON index a family ships next to its module -----------------------------------------

def write_index(path: str | Path, entries: list[FamilyEnv]) -> None:
    """Write a family's index atomically: a JSON list of entries sorted by name, one object per line (diffable)."""
    rows = [asdict(entry) for entry in sorted(entries, key=lambda e: e.name)]
    text = "[\n" + ",\n".join(json.dumps(row, sort_keys=True) for row in rows) + "\n]\n"
    atomic_write_bytes(Path(path), text.encode())


def load_index(path: str | Path, source: str) -> list[FamilyEnv]:
    """A family's entries from its index; every row must name `source` and carry exactly FamilyEnv's fields."""
    rows = json.loads(Path(path).read_text())
    names = {f.name for f in fields(FamilyEnv)}
    entries = []
    for number, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != names:
            raise ValueError(f"{path}: entry {number} has fields {sorted(row) if isinstance(row, dict) else row!r}, "
                             f"not {sorted(names)}; regenerate the index with the family's write_index()")
        entry = FamilyEnv(**{**row, "configs": tuple(row["configs"]), "tags": tuple(row["tags"])})
        if entry.source != source:
            raise ValueError(f"{path}: entry {entry.name!r} names source {entry.source!r}, not {source!r}")
        entries.append(entry)
    return entries


# -- helpers for the registry and for family modules ------------------------------------------

def validate_entries(family: EnvFamily, entries: list[FamilyEnv]) -> list[FamilyEnv]:
    """Refuse an index that would confuse name lookup: a name outside the prefix, a repeated name, a bad kind."""
    seen: set[str] = set()
    for entry in entries:
        problem = ("does not start with the family prefix " + repr(family.prefix)
                   if not entry.name.startswith(family.prefix) else
                   "is listed twice" if entry.name in seen else
                   f"has kind {entry.kind!r}, not one of {', '.join(KINDS)}" if entry.kind not in KINDS else
                   "has no configs" if not entry.configs else None)
        if problem:
            raise ValueError(f"family {family.name!r}: env {entry.name!r} {problem}; fix the family's index")
        seen.add(entry.name)
    return entries


def closest(name: str, names: list[str], count: int = 5) -> list[str]:
    """The known names nearest to a mistyped one (difflib's ratio), best first."""
    return difflib.get_close_matches(name, names, n=count, cutoff=0.5)


def unknown_env(name: str, family_name: str, names: list[str]) -> EnvNotFoundError:
    """The error for a name in a family's prefix that the family does not have."""
    near = closest(name, names)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    return EnvNotFoundError(f"no environment named {name!r} in family {family_name!r}; {hint}"
                            f"list the family with `hubgym envs --source {family_name}`")
