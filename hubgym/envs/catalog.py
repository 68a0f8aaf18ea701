"""The environment catalog: what each known env is, without building any.

    for entry in catalog():                                    # built-ins, families, then entry points
        print(entry.name, entry.kind, entry.source, entry.configs)
    catalog(source="reasoning_gym", tags=["math"], pattern="rg_*count*")   # a slice: filters combine

No row is generated and no bridged package imported. Family envs are read from each family's shipped index.
Built-ins are read from `builtin_catalog.json` beside this module while the sha256 of their builder module
still matches (else from the class: a stale index costs speed, never truth), so listing them does not import
datasets; `python -m hubgym.envs.catalog` regenerates it. Entry points are read from their builder classes. A
builder or family that fails to load is one row holding the error, never the end of the listing.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import inspect
import json
import re
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hubgym.builders import registry
from hubgym.builders.families import FamilyEnv
from hubgym.files import atomic_write_bytes

if TYPE_CHECKING:
    from hubgym.builders.base import TaskBuilder

FROM_DATA = "from data"
"""Split sizes of a builder that overrides `_split_generators`: they depend on its source data."""

BUILTIN_INDEX = Path(__file__).with_name("builtin_catalog.json")
"""{env: {"sha256": of its builder module's source, "entry": its EnvEntry}}, written by write_builtin_index."""

_SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")  # datasets names shards `<name>-<split>-00000-of-00004.<fmt>`
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class EnvEntry:
    """One row of the catalog. `error` is set (and the rest left empty) when the builder or family failed to load.

    env_id, splits and verifier are known only for envs read from their class (built-ins, entry points)."""

    name: str
    env_id: str = ""
    kind: str = ""
    configs: list[str] = field(default_factory=list)
    splits: dict[str, str] = field(default_factory=dict)  # config -> "train=150 test=30" or FROM_DATA
    tools: list[str] = field(default_factory=list)
    verifier: str = ""
    error: str | None = None
    source: str = registry.BUILTIN  # "builtin" | a family's name | "entry point"
    tags: list[str] = field(default_factory=list)
    description: str = ""


@dataclass(frozen=True)
class CatalogFilter:
    """Which rows to keep; every given criterion must hold (tags: all of them)."""

    source: str | None = None  # "builtin", a family name, or "entry point"
    kind: str | None = None
    tags: tuple[str, ...] = ()
    pattern: str | None = None  # a substring of the name, or a glob when it holds * ? or [

    def name_matches(self, name: str) -> bool:
        if not self.pattern:
            return True
        return fnmatch.fnmatchcase(name, self.pattern) if _GLOB.search(self.pattern) else self.pattern in name

    def keeps(self, entry: EnvEntry) -> bool:
        """A row that failed to load is kept while its source and name are in scope: the user should see it."""
        if (self.source and entry.source != self.source) or not self.name_matches(entry.name):
            return False
        if entry.error:
            return True
        return (not self.kind or entry.kind == self.kind) and set(self.tags) <= set(entry.tags)


def describe(builder: type[TaskBuilder], name: str | None = None, source: str = registry.BUILTIN) -> EnvEntry:
    """The catalog entry of one builder class."""
    from hubgym.builders.base import TaskBuilder

    custom_splits = builder._split_generators is not TaskBuilder._split_generators
    splits = {c.name: FROM_DATA if custom_splits else _sizes_text(getattr(c, "sizes", {}))
              for c in builder.BUILDER_CONFIGS}
    return EnvEntry(name=name or builder.ENV, env_id=builder.env_id(), kind=builder.KIND,
                    configs=builder.config_names(), splits=splits, tools=list(builder.TOOLS),
                    verifier=builder.VERIFIER, source=source, tags=list(getattr(builder, "TAGS", ())),
                    description=_first_line(inspect.getdoc(builder)))


def from_family(entry: FamilyEnv) -> EnvEntry:
    """The catalog entry of a family env, from its index row alone."""
    return EnvEntry(name=entry.name, kind=entry.kind, configs=list(entry.configs), source=entry.source,
                    tags=list(entry.tags), description=entry.description)


def catalog(names: list[str] | None = None, *, source: str | None = None, kind: str | None = None,
            tags: tuple[str, ...] | list[str] = (), pattern: str | None = None) -> list[EnvEntry]:
    """Entries for `names` (default: the whole catalog: built-ins, families, entry points), filtered.

    Filters by name and source apply before anything is imported, so a slice costs only what it lists."""
    wanted = CatalogFilter(source, kind, tuple(tags), pattern)
    if names is not None:
        return [e for e in map(_entry_for_name, names) if wanted.keeps(e)]
    entries = [builtin_entry(name) for name in registry.BUILTIN_ENVS
               if source in (None, registry.BUILTIN) and wanted.name_matches(name)]
    for family in registry.FAMILIES:
        if source in (None, family):
            entries += _family_rows(family)
    if source in (None, registry.ENTRY_POINT):
        entries += [_builder_entry(name, registry.ENTRY_POINT) for name in registry.env_names(registry.ENTRY_POINT)
                    if wanted.name_matches(name)]
    return [e for e in entries if wanted.keeps(e)]


def _entry_for_name(name: str) -> EnvEntry:
    """One named env's row, from wherever the registry finds it (a family's from its index)."""
    if name in registry.BUILTIN_ENVS:
        return builtin_entry(name)
    family = registry.family_for(name)
    rows = {e.name: e for e in registry.family_entries_or_none(family) or []} if family else {}
    return from_family(rows[name]) if name in rows else _builder_entry(name, registry.ENTRY_POINT)


def builtin_entry(name: str) -> EnvEntry:
    """A built-in's row from the shipped index while its builder module is unchanged; else from its class."""
    indexed = _builtin_index().get(name)
    if indexed is not None and indexed["sha256"] == _builder_module_sha256(name):
        return EnvEntry(**indexed["entry"])
    return _builder_entry(name, registry.BUILTIN)


def write_builtin_index(path: Path = BUILTIN_INDEX) -> None:
    """Describe every built-in from its class and write the index (atomically), one env a line."""
    rows = {name: {"sha256": _builder_module_sha256(name), "entry": asdict(_builder_entry(name, registry.BUILTIN))}
            for name in registry.BUILTIN_ENVS}
    text = "{\n" + ",\n".join(f"{json.dumps(name)}: {json.dumps(row)}" for name, row in rows.items()) + "\n}\n"
    atomic_write_bytes(path, text.encode())


@cache
def _builtin_index() -> dict[str, Any]:
    try:
        return json.loads(BUILTIN_INDEX.read_text())
    except (OSError, ValueError):  # missing or damaged: every built-in is read from its class
        return {}


def _builder_module_sha256(name: str) -> str | None:
    """sha256 of a built-in's builder module source, found without importing it."""
    spec = importlib.util.find_spec(registry.BUILTIN_ENVS[name].partition(":")[0])
    origin = spec.origin if spec is not None else None
    return hashlib.sha256(Path(origin).read_bytes()).hexdigest() if origin and Path(origin).is_file() else None


def _builder_entry(name: str, source: str) -> EnvEntry:
    from hubgym.envs.resolve import resolve_env

    try:
        return describe(resolve_env(name), name, source)
    except Exception as exc:  # one broken env must not hide the catalog
        return EnvEntry(name=name, source=source, error=f"{type(exc).__name__}: {exc}")


def _family_rows(family: str) -> list[EnvEntry]:
    """A family's rows; one row named after the family, holding the error, when its module or index fails."""
    try:
        return [from_family(entry) for entry in registry.family_entries(family)]
    except Exception as exc:  # a missing or broken bridge: listed, never fatal
        return [EnvEntry(name=family, source=family,
                         error=f"family {registry.FAMILIES[family]} failed to load: {type(exc).__name__}: {exc}")]


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0]


def _sizes_text(sizes: dict[str, int]) -> str:
    return " ".join(f"{split}={size}" for split, size in sizes.items())


def split_of(path: Path) -> str:
    """The split a built file holds, from datasets' file naming `<builder>-<split>[-NNNNN-of-NNNNN].<fmt>`."""
    stem = _SHARD_SUFFIX.sub("", path.name.rsplit(".", 1)[0])
    return stem.rsplit("-", 1)[-1]


def count_rows(path: Path) -> int:
    """Rows in a Parquet file (from its footer) or a datasets `.arrow` file (Arrow IPC stream format)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return pq.ParquetFile(path).metadata.num_rows
    with pa.memory_map(str(path)) as source:
        return sum(batch.num_rows for batch in pa.ipc.open_stream(source))


if __name__ == "__main__":  # python -m hubgym.envs.catalog: regenerate the built-ins' index after changing a builder
    write_builtin_index()
    print(f"wrote {BUILTIN_INDEX}")
