"""The hub interface: repos of files with immutable revisions, behind one small API.

Two backends implement it: `HfHub` (the Hugging Face Hub through huggingface_hub) and
`LocalHub` (a folder, the default on a machine with no network). Both give every commit a new
revision id, keep old revisions loadable, and hand back a revision as a local folder laid out
exactly like the Hub repo, so `datasets.load_dataset(snapshot.path, CONFIG)` behaves the same.

    hub = get_hub()                              # $HUBGYM_HUB: "hf", an endpoint URL, or a folder (hubgym.hub.factory)
    hub.create_repo("org/arith")
    rev = hub.commit("org/arith", {"README.md": b"...", "data/x.parquet": Path("x.parquet")}, "push")
    snap = hub.resolve("org/arith", rev)         # Snapshot(repo, revision, path)
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from hubgym.errors import EnvNotFoundError
from hubgym.hub.names import (  # noqa: F401  (check_name and check_repo_path re-exported)
    check_name, check_repo_id, check_repo_path, check_revision, shown,
)

FileSource = Path | bytes
"""A file to commit: its bytes, or the path of a local file holding them."""

GITATTRIBUTES = ".gitattributes"
"""Every repo starts with it (as on the Hub); `commit(..., replace=True)` keeps it."""

_HEX = re.compile(r"[0-9a-f]{7,40}")
HUB_ENV_VAR = "HUBGYM_HUB"
DEFAULT_LOCAL_HUB = Path("~/.cache/hubgym/hub")


@dataclass(frozen=True)
class Revision:
    """One commit of a repo."""

    id: str  # full commit id (40 hex)
    message: str
    date: str  # ISO 8601, UTC


@dataclass(frozen=True)
class Snapshot:
    """A revision of a repo as a local folder (read it, never write to it)."""

    repo: str
    revision: str  # the full commit id, even when a branch name was asked for
    path: Path


class HubBackend(ABC):
    """Where env and rollout repos live. Every method names the repo as `org/name`."""

    name: str  # "local" or "hf", shown in messages

    @abstractmethod
    def create_repo(self, repo: str) -> None:
        """Create the repo (with an initial commit) if it does not exist; no-op if it does."""

    @abstractmethod
    def commit(self, repo: str, files: Mapping[str, FileSource], message: str, *, replace: bool = False) -> str:
        """Add (or overwrite) `files` in one atomic commit and return the new revision id.

        With `replace=True` the new revision holds exactly `files` (plus .gitattributes): paths of
        the previous revision not listed are deleted. A commit that changes nothing returns the
        current revision (no empty commits, as on the Hub). A commit that fails leaves the
        previous revision as the head.
        """

    @abstractmethod
    def revisions(self, repo: str) -> list[Revision]:
        """The commits of the main branch, newest first."""

    @abstractmethod
    def resolve(self, repo: str, revision: str | None = None, *, patterns: list[str] | None = None) -> Snapshot:
        """The revision (branch, full or unique short commit id; default main) as a local folder.

        `patterns` (fnmatch globs) limits which files are fetched, for backends that download.
        """

    @abstractmethod
    def exists(self, repo: str, revision: str | None = None) -> bool:
        """Whether the repo (and, if given, the revision) exists."""

    def location(self, repo: str) -> str:
        """Where the repo lives, for messages (a URL or a folder)."""
        return repo

    @abstractmethod
    def spec(self) -> str:
        """How `get_hub` (`hub=`, `--hub`) names this hub again: a folder or an endpoint URL."""

    def stream_urls(self, snapshot: Snapshot, paths: list[str]) -> tuple[list[str], dict]:
        """Where `datasets` can stream these files of a revision from, and the load_dataset arguments to open them.

        Default: the files of the local snapshot. Backends that download override it to read
        remotely (pinned to the revision) without downloading whole files.
        """
        return [str(snapshot.path / check_repo_path(p)) for p in paths], {}


def parse_ref(ref: str) -> tuple[str, str | None]:
    """`org/name@revision` -> ("org/name", "revision"); the revision is optional. Both are checked."""
    repo, at, revision = str(ref).partition("@")
    check_repo_id(repo)
    if at and not revision:
        raise EnvNotFoundError(f"{ref!r} has an empty revision after '@'; write org/name@<commit id or branch>")
    return repo, check_revision(revision) if at else None


def expand_revision(revision: str, revisions: list[Revision]) -> str | None:
    """A unique commit-id prefix (7 to 40 hex digits, as the Hub takes them) -> the full id; None if no commit or
    several match."""
    if not _HEX.fullmatch(revision):
        return None
    found = [r.id for r in revisions if r.id.startswith(revision)]
    return found[0] if len(found) == 1 else None


def is_short_commit(revision: str) -> bool:
    """Whether `revision` reads as a shortened commit id (7 to 39 hex digits)."""
    return len(revision) < 40 and bool(_HEX.fullmatch(revision))


def not_found(hub: HubBackend, repo: str, revision: str | None = None) -> EnvNotFoundError:
    """The error for a missing repo or revision, with what to do about it."""
    where = hub.location(repo)
    if revision is None:
        return EnvNotFoundError(f"no repo {repo!r} on the {hub.name} hub ({where}); push one with "
                                f"`hubgym push ENV {repo}`, or check the name and the hub (${HUB_ENV_VAR})")
    return EnvNotFoundError(f"repo {repo!r} on the {hub.name} hub has no revision {shown(revision)}; "
                            f"list its revisions with hub.revisions({repo!r}), or load the latest with {repo!r} "
                            "(no @revision)")
