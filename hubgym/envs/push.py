"""Push an environment to a hub: its tasks as Parquet data files, a dataset card, the verifier and a manifest.

    push_env("arithmetic", "org/arith")                               # every config, to get_hub()
    push_env("wordle", "org/wordle", configs=["default"], overrides={"sizes": {"train": 50, "test": 10}},
             hub="hf")

Everything is built into a temporary folder first and then sent as one commit, so a build that
fails touches nothing, and a commit that fails leaves the repo's previous revision as it was.
The new revision holds exactly this push (files of earlier pushes that are gone are deleted).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import pyarrow.compute as pc
import pyarrow.parquet as pq

from hubgym import __version__
from hubgym.builders.base import TaskBuilder
from hubgym.envs.resolve import resolve_env
from hubgym.errors import EnvContractError, Where
from hubgym.hub.base import FileSource, HubBackend
from hubgym.hub.factory import get_hub, hub_argument
from hubgym.hub.card import render_card
from hubgym.hub.manifest import (
    CARD_FILE, FORMAT, GOLDEN_FILE, MANIFEST_FILE, TOOLS_FILE, VERIFIER_FILE, data_path, dumps,
)
from hubgym.hub.names import check_name, check_repo_id
from hubgym.hub.trust import code_sha256, pin_hints
from hubgym.schemas.version import SCHEMA_VERSION

_BASE_CONFIG_FIELDS = {"name", "version", "data_dir", "data_files", "description"}


@dataclass(frozen=True)
class PushResult:
    repo: str
    revision: str  # the commit id of the pushed revision (unchanged if the push changed nothing)
    location: str  # the repo's URL or folder
    files: list[str]  # repo paths of the revision
    manifest: dict
    hub: str | None = None  # the hub argument that reaches it again (None: the default hub)

    @property
    def ref(self) -> str:
        """`org/name@<commit id>`: what to give `load_env` to get exactly this revision back."""
        return f"{self.repo}@{self.revision}"

    def load_hints(self) -> tuple[str, str]:
        """How to load exactly this revision with its code pinned: the `hubgym.load_env(...)` call, and the
        options of `hubgym rollout` / `hubgym score` (both name the hub unless it is the default one)."""
        return pin_hints(self.ref, self.manifest["code"]["sha256"], self.hub)


@dataclass
class _Built:
    """One config, materialized: its data files and what the manifest says about it."""

    files: dict[str, Path]
    summary: dict[str, Any]
    tools: set[str]  # every tool a row offers
    shaped: set[str]  # every tool a row rewards per call
    first: dict | None  # the first row (for the card and the default interaction)


def push_env(env: str | type[TaskBuilder], repo: str, *, hub: HubBackend | str | os.PathLike | None = None,
             configs: list[str] | None = None, overrides: Mapping[str, Any] | None = None,
             message: str | None = None) -> PushResult:
    """Build `env` (all configs, or `configs`) and push it to `repo` as one new revision.

    `overrides` sets builder-config fields for every pushed config (e.g. `sizes`, `seed`); the
    values used are recorded in the manifest.
    """
    cls = resolve_env(env)
    check_repo_id(repo)
    backend = get_hub(hub)
    names = configs or cls.config_names()
    unknown = [n for n in names if n not in cls.config_names()]
    if unknown:
        raise EnvContractError(f"{cls.ENV} has no config {unknown[0]!r}", Where(cls.ENV, unknown[0]),
                               f"choose among {', '.join(cls.config_names())}")
    for name in names:  # each becomes a folder of the repo (data/<config>/) and a `datasets` config
        check_name(name, "config name")
    with tempfile.TemporaryDirectory(prefix="hubgym-push-") as tmp:
        files, manifest = stage_env(cls, repo, names, dict(overrides or {}), Path(tmp))
        backend.create_repo(repo)
        revision = backend.commit(repo, files, message or f"Push {cls.env_id()} ({', '.join(names)})", replace=True)
    return PushResult(repo, revision, backend.location(repo), sorted(files), manifest, hub_argument(backend))


def stage_env(cls: type[TaskBuilder], repo: str, names: list[str], overrides: dict,
              tmp: Path) -> tuple[dict[str, FileSource], dict]:
    """Every file of the env repo ({repo path: local file or bytes}) and its manifest, built under `tmp`."""
    built = {name: _materialize(cls, name, overrides, tmp) for name in names}
    verifier = cls.verifier()
    files: dict[str, FileSource] = {p: f for b in built.values() for p, f in b.files.items()}
    files[VERIFIER_FILE] = _code_file(verifier.source_path, verifier.sha256, cls.ENV, "VERIFIER")
    if verifier.tools:
        files[TOOLS_FILE] = _code_file(verifier.tools.path, verifier.tools.sha256, cls.ENV, "TOOLS_MODULE")
    golden = cls.source_dir() / cls.GOLDEN
    if golden.is_file():
        files[GOLDEN_FILE] = golden.read_bytes()
    manifest = _manifest(cls, verifier, built, golden.is_file())
    files[MANIFEST_FILE] = dumps(manifest)
    files[CARD_FILE] = render_card(manifest, repo, built[names[0]].first, cls.__doc__).encode()
    return files, manifest


def _code_file(path: Path | None, sha256: str, env: str, field: str) -> bytes:
    """The bytes of a code file that was imported, refused when they are not the bytes that ran."""
    source = path.read_bytes() if path is not None and path.is_file() else b""
    if hashlib.sha256(source).hexdigest() != sha256:
        raise EnvContractError(f"{path} changed on disk since it was imported (or cannot be read)",
                               Where(env, field=field), "push from a fresh process")
    return source


def _materialize(cls: type[TaskBuilder], name: str, overrides: dict, tmp: Path) -> _Built:
    """Build one config's splits as Parquet shards, named as the Hub names them."""
    try:
        builder = cls(config_name=name, cache_dir=str(tmp / "cache" / name), dataset_name=cls.ENV, **overrides)
    except ValueError as exc:  # datasets: "BuilderConfig ... doesn't have a 'x' key"
        raise EnvContractError(f"cannot override the config of {cls.ENV}: {exc}", Where(cls.ENV, name),
                               f"override only fields of {cls.BUILDER_CONFIG_CLASS.__name__}") from None
    out = tmp / "build" / name
    builder.download_and_prepare(output_dir=str(out), file_format="parquet", download_mode="force_redownload",
                                 verification_mode="no_checks")
    files, splits, first = {}, {}, None
    kinds, tools, shaped = set(), set(), set()
    for split, info in builder.info.splits.items():
        shards = sorted(out.glob(f"{cls.ENV}-{split}.parquet")) or sorted(out.glob(f"{cls.ENV}-{split}-*-of-*.parquet"))
        if not shards:
            raise EnvContractError(f"split {split!r} has no rows to push", Where(cls.ENV, name, split),
                                   "give every split in `sizes` at least one task, or leave the split out")
        paths = [data_path(name, split, i, len(shards)) for i in range(len(shards))]
        files.update(zip(paths, shards, strict=True))
        splits[split] = {"num_rows": info.num_examples, "files": paths}
        for shard in shards:
            spec = pq.read_table(shard, columns=["interaction"]).column("interaction").combine_chunks()
            kinds |= _unique(spec.field("kind"))
            tools |= _unique(pc.list_flatten(spec.field("tools")))
            shaped |= _unique(pc.struct_field(pc.list_flatten(spec.field("tool_rewards")), "tool"))
        first = first or _first_row(shards[0])
    params = {f.name: _jsonable(getattr(builder.config, f.name)) for f in fields(builder.config)
              if f.name not in _BASE_CONFIG_FIELDS}
    return _Built(files, {"params": params, "kinds": sorted(kinds), "splits": splits}, tools, shaped, first)


def _unique(column) -> set[str]:
    return {v for v in pc.unique(column).to_pylist() if v is not None}


def _first_row(shard: Path) -> dict | None:
    table = pq.read_table(shard).slice(0, 1).to_pylist()
    if not table:
        return None
    row = table[0]
    return {**row, "info": json.loads(row["info"]) if isinstance(row["info"], str) else row["info"]}


def _manifest(cls: type[TaskBuilder], verifier, built: dict[str, _Built], has_golden: bool) -> dict:
    first = next((b.first for b in built.values() if b.first is not None), None)
    code = {VERIFIER_FILE: verifier.sha256, **({TOOLS_FILE: verifier.tools.sha256} if verifier.tools else {})}
    return {
        "format": FORMAT, "schema_version": SCHEMA_VERSION, "hubgym_version": __version__,
        "env": cls.ENV, "env_version": cls.ENV_VERSION, "env_id": cls.env_id(), "kind": cls.KIND,
        "tools": sorted(set(cls.TOOLS).union(*(b.tools for b in built.values()))),
        "tool_rewards": sorted(set().union(*(b.shaped for b in built.values()))),
        "verifier": {
            "path": VERIFIER_FILE, "module": verifier.name, "sha256": verifier.sha256,
            "rewards": dict(verifier.weights),
            "reward_range": list(verifier.reward_range), "success_threshold": verifier.success_threshold,
            "multi_turn": verifier.multi_turn,
        },
        "tools_module": ({"path": TOOLS_FILE, "module": verifier.tools.module, "sha256": verifier.tools.sha256}
                         if verifier.tools else None),
        "code": {"files": code, "sha256": code_sha256(code)},
        "golden": GOLDEN_FILE if has_golden else None,
        "interaction": first["interaction"] if first else None,
        "default_config": next(iter(built)),
        "configs": {name: b.summary for name, b in built.items()},
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
