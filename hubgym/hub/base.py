"""The hub interface: repos of files with immutable revisions, behind one small API.

Two backends implement it: `HfHub` (the Hugging Face Hub through huggingface_hub) and
`LocalHub` (a folder, the default on a machine with no network). Both give every commit a new
revision id, keep old revisions loadable, and hand back a revision as a local folder laid out
exactly like the Hub repo, so `datasets.load_dataset(snapshot.path, CONFIG)` behaves the same.

    hub = get_hub()                              # $HUBGYM_HUB: "hf", an endpoint URL, or a folder
    hub.create_repo("org/arith")
    rev = hub.commit("org/arith", {"README.md": b"...", "data/x.parquet": Path("x.parquet")}, "push")
    snap = hub.resolve("org/arith", rev)         # Snapshot(repo, revision, path)
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from hubgym.errors import EnvContractError, EnvNotFoundError, Where

FileSource = Path | bytes
"""A file to commit: its bytes, or the path of a local file holding them."""

GITATTRIBUTES = ".gitattributes"
"""Every repo starts with it (as on the Hub); `commit(..., replace=True)` keeps it."""

_NAME_CHARS = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
_EDGE = re.compile(r"[A-Za-z0-9_]", re.ASCII)
_HEX = re.compile(r"[0-9a-f]{7,40}")
_REF_FORBIDDEN = "~^:?*[\\"  # git check-ref-format: never in a branch or tag name
MAX_NAME = 96  # the Hub's limit for each part of a repo id (huggingface_hub.utils.validate_repo_id)
MAX_REVISION = 255  # a revision becomes a file name in the client's cache (refs/<revision>)
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


def check_repo_id(repo: str) -> str:
    """Refuse a repo id the Hub would refuse, before any request or folder is made from it (it becomes a URL path
    and a folder): `org/name`, each part 1-96 of ASCII letters, digits, '-', '_', '.', starting and ending with a
    letter, digit or '_', without '--' or '..', the name not ending in '.git' (huggingface_hub's rules)."""
    rule = _repo_id_rule(repo)
    if rule is not None:
        raise EnvNotFoundError(f"{shown(repo)} is not a hub repo id: {rule}; write org/name (letters, digits, "
                               f"'-', '_', '.'), optionally @revision")
    return repo


def _repo_id_rule(repo: object) -> str | None:
    if not isinstance(repo, str):
        return f"it is a {type(repo).__name__}, not a string"
    parts = repo.split("/")
    if len(parts) != 2:
        return "it must be an owner and a name with one '/' between them"
    for part in parts:
        if not part or len(part) > MAX_NAME:
            return f"each part is 1 to {MAX_NAME} characters"
        if not _NAME_CHARS.fullmatch(part):
            return "only ASCII letters, digits, '-', '_' and '.' are allowed"
        if not (_EDGE.fullmatch(part[0]) and _EDGE.fullmatch(part[-1])):
            return "each part starts and ends with a letter, a digit or '_'"
    if "--" in repo or ".." in repo:
        return "'--' and '..' are not allowed"
    if repo.endswith(".git"):
        return "a name cannot end in '.git'"
    return None


def check_revision(revision: str) -> str:
    """Refuse a revision the Hub could not hold, before it reaches a URL or a path: a branch or tag name as git
    allows it (no '..', no control or space characters, none of ~ ^ : ? * [ \\, '/' only between parts, no part
    starting with '.' or ending in '.lock'), or a commit id; at most 255 characters."""
    rule = _revision_rule(revision)
    if rule is not None:
        raise EnvNotFoundError(f"{shown(revision)} is not a revision: {rule}; give a branch (main), a tag, or a "
                               f"commit id (7 to 40 hex digits)")
    return revision


def _revision_rule(revision: object) -> str | None:
    if not isinstance(revision, str):
        return f"it is a {type(revision).__name__}, not a string"
    if not revision or len(revision) > MAX_REVISION:
        return f"it must be 1 to {MAX_REVISION} characters"
    if any(c.isspace() or not c.isprintable() for c in revision):
        return "control, space and invisible characters are not allowed"
    if any(c in _REF_FORBIDDEN for c in revision):
        return "none of ~ ^ : ? * [ \\ is allowed"
    if ".." in revision or "@{" in revision or revision == "@":
        return "'..', '@{' and a lone '@' are not allowed"
    parts = revision.split("/")
    if any(not part for part in parts):
        return "'/' may only separate parts (not lead, trail or repeat)"
    if any(part.startswith(".") or part.endswith(".lock") for part in parts) or revision.endswith("."):
        return "no part may start with '.' or end in '.lock', and it cannot end in '.'"
    return None


def check_name(name: str, what: str = "config name") -> str:
    """Refuse a config or run name that could not be a folder of a repo and a `datasets` config: 1-96 ASCII
    letters, digits, '-', '_', '.', starting with a letter or digit (so never '.', '..' or a hidden folder)."""
    if not isinstance(name, str):
        rule = f"it is a {type(name).__name__}, not a string"
    elif not name or len(name) > MAX_NAME:
        rule = f"it must be 1 to {MAX_NAME} characters"
    elif not _NAME_CHARS.fullmatch(name):
        rule = "only ASCII letters, digits, '-', '_' and '.' are allowed"
    elif not name[0].isalnum():
        rule = "it must start with a letter or a digit"
    else:
        return name
    raise EnvContractError(f"{shown(name)} is not a valid {what}: {rule}", Where(config=str(name)[:MAX_NAME],
                           field=what), "name it with letters, digits, '-', '_' and '.' (it becomes a folder of "
                           "the repo and a `datasets` config)")


def check_repo_path(path: str) -> str:
    """Repo paths are relative POSIX paths of non-empty parts, none '.' or '..': a path read or written never
    leaves its repo."""
    parts = str(path).split("/")
    if not path or "\\" in path or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise EnvContractError(f"{shown(path)} is not a valid path in a repo", Where(field=str(path)[:200]),
                               "use a relative POSIX path such as data/<config>/<split>-00000-of-00001.parquet")
    return path


def shown(value: object, limit: int = 100) -> str:
    """A value as messages show it: repr, cut to `limit` characters with the full length said."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    return repr(value)


def get_hub(spec: HubBackend | str | os.PathLike | None = None) -> HubBackend:
    """The hub named by `spec`, else by $HUBGYM_HUB, else the local hub folder ~/.cache/hubgym/hub.

    "hf" (or "huggingface") is the Hugging Face Hub at HF_ENDPOINT; an http(s) URL is a Hub-API
    server at that URL; anything else is a local hub folder.
    """
    if isinstance(spec, HubBackend):
        return spec
    spec = os.fspath(spec) if spec is not None else os.environ.get(HUB_ENV_VAR) or str(DEFAULT_LOCAL_HUB)
    if spec in ("hf", "hf:", "huggingface"):
        from hubgym.hub.hf import HfHub

        return HfHub()
    if spec.startswith(("http://", "https://")):
        from hubgym.hub.hf import HfHub

        return HfHub(endpoint=spec)
    from hubgym.hub.local import LocalHub

    return LocalHub(Path(spec.removeprefix("file://")).expanduser())


def hub_argument(hub: HubBackend) -> str | None:
    """What `hub=` / `--hub` must say to reach this hub again; None when it is the default hub (`get_hub()`)."""
    spec = hub.spec()
    return None if spec == get_hub().spec() else spec


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
    return EnvNotFoundError(f"repo {repo!r} on the {hub.name} hub has no revision {shown(revision)}; list its revisions "
                            f"with hub.revisions({repo!r}), or load the latest with {repo!r} (no @revision)")
