"""The catalog as a mixture selects from it: envs by name, family (source) and tag, with their builders on demand.

    lst = listing()                                  # the catalog's rows (hubgym.envs.catalog), loaded ones only
    lst.by_tag("math"); lst.by_source("reasoning_gym"); lst.builder("arithmetic")
    Listing([...FamilyEnv rows...], builders={"fake_0": lambda: FakeBuilder})   # tests: any rows, any builders

The rows are `catalog()`'s (one enumeration of every known env: built-ins from their shipped index, entry
points from their builder classes, families from their shipped indexes); a builder is resolved only when a
task of that env is drawn, or when a spec names an env the catalog does not list (a folder, a versioned id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hubgym.builders.base import TaskBuilder
from hubgym.builders.families import FamilyEnv
from hubgym.envs.resolve import resolve_env
from hubgym.envs.refs import parse_ref

__all__ = ["Listed", "Listing", "listing"]

BUILTIN_SOURCE = "builtin"


@dataclass(frozen=True)
class Listed:
    """One env of the listing: its catalog row (FamilyEnv's fields) and the tools its rows may offer."""

    name: str
    kind: str
    configs: tuple[str, ...]
    tags: tuple[str, ...]
    source: str
    tools: tuple[str, ...]


class Listing:
    """Rows by name, with how to get each env's builder class (called lazily, at most once per env)."""

    def __init__(self, rows: list[FamilyEnv], builders: dict[str, Callable[[], type[TaskBuilder]]],
                 tools: dict[str, tuple[str, ...]] | None = None):
        tools = tools or {}
        self._rows = {r.name: Listed(r.name, r.kind, tuple(r.configs), tuple(r.tags), r.source,
                                     tools.get(r.name, _kind_tools(r.kind))) for r in rows}
        self._builders = dict(builders)
        self._resolved: dict[str, type[TaskBuilder]] = {}

    def find(self, ref: str) -> Listed | None:
        """A listed env by name; else a folder, `.py` file, versioned id or entry point resolved to its builder
        (EnvNotFoundError naming it when nothing is); None for a hub ref `org/name[@rev]` (opened lazily)."""
        if ref in self._rows:
            return self._rows[ref]
        if parse_ref(ref).kind == "hub":
            return None
        builder = resolve_env(ref)  # raises EnvNotFoundError naming the ref and the known envs
        self._resolved[ref] = builder
        return _describe(builder, builder.ENV)  # the name its rows carry (a folder or a versioned id resolves to it)

    def builder(self, ref: str) -> type[TaskBuilder]:
        """The builder class of a listed or resolvable env (cached: the same class on every call)."""
        if ref not in self._resolved:
            self._resolved[ref] = self._builders[ref]() if ref in self._builders else resolve_env(ref)
        return self._resolved[ref]

    def by_source(self, source: str) -> list[Listed]:
        return [r for r in self._rows.values() if r.source == source]

    def by_tag(self, tag: str) -> list[Listed]:
        return [r for r in self._rows.values() if tag in r.tags]

    def sources(self) -> list[str]:
        return sorted({r.source for r in self._rows.values()})

    def tags(self) -> list[str]:
        return sorted({t for r in self._rows.values() for t in r.tags})

    def __len__(self) -> int:
        return len(self._rows)


def _describe(builder: type[TaskBuilder], name: str) -> Listed:
    return Listed(name, builder.KIND, tuple(builder.config_names()), tuple(getattr(builder, "TAGS", ())),
                  BUILTIN_SOURCE, tuple(builder.TOOLS) or _kind_tools(builder.KIND))


def _kind_tools(kind: str) -> tuple[str, ...]:
    """A family row names no tools; a tool_use env offers some (which ones is known once its builder loads)."""
    return ("tools of a tool_use env",) if kind == "tool_use" else ()


def listing() -> Listing:
    """The catalog's rows (nothing generated; a family's package imported only when one of its envs is drawn). A
    row the catalog could not load is left out (`hubgym envs` shows its error); naming that env then fails as
    resolving it fails."""
    from hubgym.envs.catalog import catalog

    rows, tools = [], {}
    for entry in catalog():
        if entry.error:
            continue
        rows.append(FamilyEnv(entry.name, entry.kind, tuple(entry.configs), tuple(entry.tags), entry.source, ""))
        if entry.tools:
            tools[entry.name] = tuple(entry.tools)
    return Listing(rows, {}, tools)

