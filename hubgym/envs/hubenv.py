"""Opening an env from a hub: its manifest and code at one revision (pinned or trusted), and its task files.

The revision is resolved to a commit id first and everything is read at that commit, so a push that lands
meanwhile cannot mix two revisions. The manifest and the code check come before any data is read; a refused
env costs no download of its data, and running its code needs nothing installed beyond hubgym: its verifier
and tools module come from the revision itself.
"""

from __future__ import annotations

import functools
from typing import Any

import datasets

from hubgym.envs.opened import OpenedEnv
from hubgym.envs.refs import EnvRef
from hubgym.errors import EnvContractError, Where
from hubgym.hub.base import HubBackend, Snapshot
from hubgym.hub.factory import get_hub, hub_argument
from hubgym.hub.manifest import MANIFEST_FILE, METADATA_FILES, config_files, read_manifest
from hubgym.hub.trust import load_hub_verifier
from hubgym.schemas.tasks import TASK_FEATURES


def open_hub_env(ref: EnvRef, *, trust: bool, pin: str | None, hub: Any) -> OpenedEnv:
    """The env of `ref` (kind "hub") at one commit: manifest read, code checked against `pin` (or trusted) and
    loaded; no task data read."""
    backend = get_hub(hub)
    meta = backend.resolve(ref.repo, ref.revision, patterns=METADATA_FILES)  # a branch becomes a commit id here
    pinned = f"{ref.repo}@{meta.revision}"
    manifest = read_manifest(meta.path, pinned)
    verifier = load_hub_verifier(meta.path, manifest, pinned, trust=trust, pin=pin, hub=hub_argument(backend))
    config, _ = config_files(manifest, pinned, ref.config, None)
    read = functools.partial(read_hub_tasks, backend, meta, manifest, config)
    return OpenedEnv(manifest["env"], config, verifier, ref, repo=ref.repo, revision=meta.revision,
                     manifest=manifest, path=meta.path, read=read)


def read_hub_tasks(backend: HubBackend, meta: Snapshot, manifest: dict, config: str, split: str | None,
                   streaming: bool) -> Any:
    """One config's Parquet files with the fixed task features (the same files the card's YAML names): a Dataset
    (or a DatasetDict without `split`); Iterable ones, read remotely, with `streaming`."""
    ref = f"{meta.repo}@{meta.revision}"
    _, files = config_files(manifest, ref, config, split)
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
        raise EnvContractError(f"{MANIFEST_FILE} of {ref} names the data file {missing[0]!r}, which the repo does "
                               f"not hold", Where(env=ref, field=MANIFEST_FILE), "re-push the env with `hubgym push`")
    data_files = {s: [str(snapshot.path / p) for p in group] for s, group in files.items()}
    return datasets.load_dataset("parquet", data_files=data_files, split=split, features=TASK_FEATURES)
