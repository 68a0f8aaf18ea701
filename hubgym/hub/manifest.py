"""The env manifest (`hubgym.json`): what a pushed env repo holds, written by push and checked by load.

    {"format": "hubgym-env", "schema_version": "1.0", "hubgym_version": "0.1.0",
     "env": "arithmetic", "env_version": 1, "env_id": "arithmetic-v1", "kind": "single_turn",
     "tools": [],                                   # every tool any row offers
     "verifier": {"path": "verifier.py", "module": "hubgym.verifiers.arithmetic", "sha256": "...",
                  "rewards": {"correct": 1.0, "formatted": 0.0}, "reward_range": [0.0, 1.0],
                  "success_threshold": 1.0, "multi_turn": false},
     "golden": "golden.jsonl",                      # or null
     "interaction": {...},                          # the interaction spec of the first row (the default)
     "default_config": "easy",
     "configs": {"easy": {"params": {"seed": 0, "sizes": {...}, ...}, "kinds": ["single_turn"],
                          "splits": {"test": {"num_rows": 30, "files": ["data/easy/test-00000-of-00001.parquet"]}}}}}

It carries no timestamp, so pushing the same env twice changes nothing and makes no new revision.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from hubgym.errors import EnvContractError, EnvNotFoundError, Where
from hubgym.schemas.version import SCHEMA_VERSION

FORMAT = "hubgym-env"
MANIFEST_FILE = "hubgym.json"
VERIFIER_FILE = "verifier.py"
GOLDEN_FILE = "golden.jsonl"
CARD_FILE = "README.md"
METADATA_FILES = [MANIFEST_FILE, VERIFIER_FILE, GOLDEN_FILE, CARD_FILE]
"""The small files of an env repo: what a streaming load downloads (the data files are read remotely)."""

REQUIRED = ("format", "schema_version", "env", "env_version", "verifier", "default_config", "configs")


def data_path(config: str, split: str, shard: int, shards: int) -> str:
    """`data/<config>/<split>-00000-of-00001.parquet`: the Hub's shard naming."""
    return f"data/{config}/{split}-{shard:05d}-of-{shards:05d}.parquet"


def dumps(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()  # insertion order: splits as built


def read_manifest(folder: Path, ref: str) -> dict[str, Any]:
    """Read and check a snapshot's manifest; every problem names the repo and says how to fix it."""
    where = Where(env=ref, field=MANIFEST_FILE)
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise EnvContractError(f"repo {ref} has no {MANIFEST_FILE}, so it is not a hubgym env (or was pushed "
                               f"by something else)", where, f"push the env with `hubgym push ENV REPO`, which "
                               f"writes {MANIFEST_FILE}; plain task data loads with datasets.load_dataset")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EnvContractError(f"{MANIFEST_FILE} of {ref} is not valid JSON ({exc})", where,
                               "re-push the env with `hubgym push`") from None
    missing = [k for k in REQUIRED if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise EnvContractError(f"{MANIFEST_FILE} of {ref} lacks {missing}", Where(env=ref, field=missing[0]),
                               "re-push the env with `hubgym push`")
    if manifest["format"] != FORMAT:
        raise EnvContractError(f"{MANIFEST_FILE} of {ref} has format {manifest['format']!r}, not {FORMAT!r}",
                               Where(env=ref, field="format"), "load it with the tool that wrote it")
    _check_schema_version(manifest["schema_version"], ref)
    try:
        _check_paths(manifest, ref)
    except (KeyError, TypeError, AttributeError) as exc:
        raise EnvContractError(f"{MANIFEST_FILE} of {ref} is malformed ({type(exc).__name__}: {exc})", where,
                               "re-push the env with `hubgym push`") from None
    return manifest


def _check_schema_version(version: str, ref: str) -> None:
    if str(version).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise EnvContractError(f"repo {ref} holds task schema {version}; this hubgym reads schema {SCHEMA_VERSION}",
                               Where(env=ref, field="schema_version"),
                               "install the hubgym version that matches the repo, or re-push the env with this one")


def _check_paths(manifest: dict, ref: str) -> None:
    """Paths in a manifest stay inside the repo: a manifest is data from someone else."""
    paths = [manifest["verifier"].get("path", "")] + [manifest["golden"]] * bool(manifest.get("golden"))
    paths += [f for c in manifest["configs"].values() for s in c["splits"].values() for f in s["files"]]
    for p in paths:
        parts = PurePosixPath(p).parts
        if not p or p.startswith("/") or "\\" in p or ".." in parts:
            raise EnvContractError(f"{MANIFEST_FILE} of {ref} names the path {p!r}, outside the repo",
                                   Where(env=ref, field=MANIFEST_FILE), "re-push the env with `hubgym push`")


def config_files(manifest: dict, ref: str, config: str | None, split: str | None) -> tuple[str, dict[str, list[str]]]:
    """(config name, {split: data files}) for a load; unknown configs and splits list the known ones."""
    config = config or manifest["default_config"]
    configs = manifest["configs"]
    if config not in configs:
        raise EnvNotFoundError(f"repo {ref} has no config {config!r}; it has {', '.join(configs)}")
    splits = {s: v["files"] for s, v in configs[config]["splits"].items()}
    if split is not None and split not in splits:
        raise EnvNotFoundError(f"config {config!r} of repo {ref} has no split {split!r}; it has {', '.join(splits)}")
    return config, splits if split is None else {split: splits[split]}
