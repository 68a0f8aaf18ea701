"""The catalog a mixture selects from: built-in envs, installed entry points and env families, by name, family
(source) and tag, listed without generating a task.

    lst = listing()                                  # built-ins + entry points + every registered family
    lst.by_tag("math"); lst.by_source("reasoning_gym"); lst.builder("arithmetic")
    Listing([...FamilyEnv rows...], builders={"fake_0": lambda: FakeBuilder})   # tests: any rows, any builders

Built-ins and entry points are described from their builder classes (importing a module, generating nothing);
a family's rows come from its shipped index (`FAMILY.entries()`), and its builder is asked for only when a
task of that env is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hubgym.builders.base import TaskBuilder
from hubgym.builders.families import FamilyEnv
from hubgym.builders.registry import env_names, resolve_env

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
        from hubgym.resolve import is_hub_ref

        if ref in self._rows:
            return self._rows[ref]
        if is_hub_ref(ref):
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
    """Built-ins and entry points (builder modules imported, nothing generated), then every registered family's
    rows from its shipped index (its package imported only when one of its envs is drawn). A family whose index
    fails to load is left out (`hubgym envs` shows its error); naming one of its envs then fails as the registry
    fails."""
    from hubgym.builders import registry

    rows, builders, tools = [], {}, {}
    for name in registry.env_names(source=registry.BUILTIN) + registry.env_names(source=registry.ENTRY_POINT):
        try:
            builder = resolve_env(name)
        except Exception:  # noqa: BLE001 - one broken entry point must not hide the others (as `hubgym envs`)
            continue
        described = _describe(builder, name)
        rows.append(FamilyEnv(name, described.kind, described.configs, described.tags, BUILTIN_SOURCE, ""))
        builders[name], tools[name] = (lambda b=builder: b), described.tools
    for family in registry.FAMILIES:
        for entry in registry.family_entries_or_none(family) or []:
            rows.append(entry)
            builders[entry.name] = lambda n=entry.name: resolve_env(n)  # the registry asks the family, once
    return Listing(rows, builders, tools)
