"""The environment catalog: what each known env is, read from its builder class without building it.

    for entry in catalog():          # built-ins, then installed `hubgym.envs` entry points
        print(entry.name, entry.kind, entry.splits)

Listing imports each builder module (cheap) but never generates a row, so `hubgym envs` stays fast.
An env whose module fails to import is listed with the error instead of hiding the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hubgym.builders.base import TaskBuilder
from hubgym.builders.registry import env_names, resolve_env

FROM_DATA = "from data"
"""Split sizes of a builder that overrides `_split_generators`: they depend on its source data."""

_SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")  # datasets names shards `<name>-<split>-00000-of-00004.<fmt>`


@dataclass(frozen=True)
class EnvEntry:
    """One row of the catalog. `error` is set (and the rest left empty) when the builder failed to load."""

    name: str
    env_id: str = ""
    kind: str = ""
    configs: list[str] = field(default_factory=list)
    splits: dict[str, str] = field(default_factory=dict)  # config -> "train=150 test=30" or FROM_DATA
    tools: list[str] = field(default_factory=list)
    verifier: str = ""
    error: str | None = None


def describe(builder: type[TaskBuilder], name: str | None = None) -> EnvEntry:
    """The catalog entry of one builder class."""
    custom_splits = builder._split_generators is not TaskBuilder._split_generators
    splits = {c.name: FROM_DATA if custom_splits else _sizes_text(getattr(c, "sizes", {}))
              for c in builder.BUILDER_CONFIGS}
    return EnvEntry(name=name or builder.ENV, env_id=builder.env_id(), kind=builder.KIND,
                    configs=builder.config_names(), splits=splits, tools=list(builder.TOOLS),
                    verifier=builder.VERIFIER)


def catalog(names: list[str] | None = None) -> list[EnvEntry]:
    """Entries for `names` (default: every registered env), in order."""
    entries = []
    for name in env_names() if names is None else names:
        try:
            entries.append(describe(resolve_env(name), name))
        except Exception as exc:  # one broken env must not hide the catalog
            entries.append(EnvEntry(name=name, error=f"{type(exc).__name__}: {exc}"))
    return entries


def _sizes_text(sizes: dict[str, int]) -> str:
    return " ".join(f"{split}={size}" for split, size in sizes.items())


def split_of(path: Path) -> str:
    """The split a built file holds, from datasets' file naming `<builder>-<split>[-NNNNN-of-NNNNN].<fmt>`."""
    stem = _SHARD_SUFFIX.sub("", path.name.rsplit(".", 1)[0])
    return stem.rsplit("-", 1)[-1]


def count_rows(path: Path) -> int:
    """Rows in a Parquet file (from its footer) or a datasets `.arrow` file (Arrow IPC stream format)."""
    if path.suffix == ".parquet":
        return pq.ParquetFile(path).metadata.num_rows
    with pa.memory_map(str(path)) as source:
        return sum(batch.num_rows for batch in pa.ipc.open_stream(source))
