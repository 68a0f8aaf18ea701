"""Load an environment from a hub: its tasks as a `datasets` dataset, and its verifier (pinned or trusted).

    env = load_env("org/arith@3f1c2e9", pin="sha256:9f2c...")       # a revision, verifier pinned
    env = load_env("org/arith", config="easy", split="test", trust=True)
    env = load_env("org/wordle", streaming=True, trust=True)         # IterableDataset: data read remotely
    env.tasks, env.verifier, env.revision, env.manifest

The revision is resolved to a commit id first and everything is read at that commit, so a push
that lands meanwhile cannot mix two revisions. The manifest and the trust check come before any
data is read; a refused verifier costs no download of the data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from hubgym.errors import EnvContractError, Where
from hubgym.hub.base import HubBackend, Snapshot, get_hub, hub_argument, parse_ref
from hubgym.hub.manifest import GOLDEN_FILE, MANIFEST_FILE, METADATA_FILES, config_files, read_manifest
from hubgym.hub.trust import load_hub_verifier
from hubgym.schemas.tasks import TASK_FEATURES
from hubgym.verifiers.contract import Verifier
from hubgym.verifiers.golden import GoldenCase, load_golden


@dataclass
class HubEnv:
    """An environment loaded from a hub at one revision."""

    repo: str
    revision: str  # the commit id the tasks and verifier were read at
    config: str
    tasks: Any  # Dataset / IterableDataset for one split, DatasetDict / IterableDatasetDict for all
    verifier: Verifier
    manifest: dict
    path: Path  # the local snapshot folder (metadata only when streaming from a remote hub)

    @property
    def ref(self) -> str:
        """`org/name@<commit id>`: loads exactly this revision again."""
        return f"{self.repo}@{self.revision}"

    @property
    def env(self) -> str:
        return self.manifest["env"]

    def golden_cases(self) -> list[GoldenCase]:
        """The env's golden cases as pushed (empty if it has none)."""
        path = self.path / GOLDEN_FILE
        return load_golden(path, env=self.env) if self.manifest.get("golden") and path.is_file() else []


def load_env(ref: str, *, trust: bool = False, pin: str | None = None, streaming: bool = False,
             config: str | None = None, split: str | None = None,
             hub: HubBackend | str | os.PathLike | None = None) -> HubEnv:
    """Load `org/name[@revision]` from `hub` (default: `get_hub()`).

    The verifier runs only if its sha256 equals `pin` ("sha256:<hex>") or `trust=True`;
    otherwise VerifierNotTrustedError says what its sha256 is and how to pin it.
    """
    repo, revision = parse_ref(ref)
    backend = get_hub(hub)
    meta = backend.resolve(repo, revision, patterns=METADATA_FILES)  # a branch becomes a commit id here
    pinned_ref = f"{repo}@{meta.revision}"
    manifest = read_manifest(meta.path, pinned_ref)
    verifier = load_hub_verifier(meta.path, manifest, pinned_ref, trust=trust, pin=pin, hub=hub_argument(backend))
    config, files = config_files(manifest, pinned_ref, config, split)
    tasks = _load_tasks(backend, meta, files, split, streaming)
    return HubEnv(repo, meta.revision, config, tasks, verifier, manifest, meta.path)


def _load_tasks(backend: HubBackend, meta: Snapshot, files: dict[str, list[str]], split: str | None,
                streaming: bool):
    """Read the config's Parquet files with the fixed task features (the same files the card's YAML names)."""
    paths = [p for group in files.values() for p in group]
    if streaming:
        urls, options = backend.stream_urls(meta, paths)
        located = dict(zip(paths, urls, strict=True))
        data_files = {s: [located[p] for p in group] for s, group in files.items()}
        return datasets.load_dataset("parquet", data_files=data_files, split=split, streaming=True,
                                     features=TASK_FEATURES, **options)
    snapshot = backend.resolve(meta.repo, meta.revision, patterns=METADATA_FILES + paths)
    missing = [p for p in paths if not (snapshot.path / p).is_file()]
    if missing:  # the manifest is data from someone else: it may name files the repo lacks
        ref = f"{meta.repo}@{meta.revision}"
        raise EnvContractError(f"{MANIFEST_FILE} of {ref} names the data file {missing[0]!r}, which the repo does "
                               f"not hold", Where(env=ref, field=MANIFEST_FILE), "re-push the env with `hubgym push`")
    data_files = {s: [str(snapshot.path / p) for p in group] for s, group in files.items()}
    return datasets.load_dataset("parquet", data_files=data_files, split=split, features=TASK_FEATURES)
