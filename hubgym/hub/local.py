"""A hub in a local folder: the embedded default on a machine with no network.

Each repo is a directory; each revision an immutable snapshot folder laid out exactly like the
Hub repo, so `datasets.load_dataset(snapshot.path, CONFIG)` behaves as it does on the Hub:

    <root>/datasets/<org>/<name>/
        refs/main             the head commit id (replaced atomically: the only thing a commit changes in place)
        commits/<id>.json     {"parent", "message", "date", "tree": {path: {"sha256", "size"}}}
        snapshots/<id>/...    the files at that revision: hard links to blobs/ (read-only)
        blobs/<sha256>        file contents, stored once however many revisions hold them
        tmp/                  staging; whatever an interrupted commit left there is cleared by the next

A commit stages the new snapshot, renames it into place, writes its record, and only then moves
`refs/main`; a push that fails at any step leaves the previous revision as the head. The commit id
is the sha1 of the record (parent, tree, message, date), as git derives ids from content.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Mapping

from hubgym.errors import EnvContractError, Where
from hubgym.files import atomic_write_bytes as _atomic_write
from hubgym.hub.base import GITATTRIBUTES, FileSource, HubBackend, Revision, Snapshot, expand_revision, not_found
from hubgym.hub.names import check_repo_id, check_repo_path, check_revision

_FULL_ID = re.compile(r"[0-9a-f]{40}")
INITIAL_GITATTRIBUTES = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n*.arrow filter=lfs diff=lfs merge=lfs -text\n"
_CHUNK = 1 << 20


class LocalHub(HubBackend):
    """Repos with revisions in a folder (see the module docstring for the layout)."""

    name = "local"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser()

    def __repr__(self) -> str:
        return f"LocalHub({str(self.root)!r})"

    def location(self, repo: str) -> str:
        return str(self._dir(repo))

    def spec(self) -> str:
        return os.path.abspath(self.root)

    # -- the interface ----------------------------------------------------------------------

    def create_repo(self, repo: str) -> None:
        folder = self._dir(check_repo_id(repo))
        folder.mkdir(parents=True, exist_ok=True)
        with self._locked(folder):
            if not (folder / "refs" / "main").is_file():
                self._commit_locked(folder, {GITATTRIBUTES: INITIAL_GITATTRIBUTES}, "initial commit", replace=False)

    def commit(self, repo: str, files: Mapping[str, FileSource], message: str, *, replace: bool = False) -> str:
        folder = self._dir(check_repo_id(repo))
        if not self.exists(repo):
            raise not_found(self, repo)
        with self._locked(folder):
            return self._commit_locked(folder, files, message, replace=replace)

    def revisions(self, repo: str) -> list[Revision]:
        folder = self._dir(check_repo_id(repo))
        if not self.exists(repo):
            raise not_found(self, repo)
        out, commit_id = [], self._head(folder)
        while commit_id:
            record = self._record(folder, commit_id)
            out.append(Revision(commit_id, record["message"], record["date"]))
            commit_id = record["parent"]
        return out

    def resolve(self, repo: str, revision: str | None = None, *, patterns: list[str] | None = None) -> Snapshot:
        folder = self._dir(check_repo_id(repo))
        if not self.exists(repo):
            raise not_found(self, repo)
        commit_id = self._find(folder, repo, check_revision(revision or "main"))
        if commit_id is None:
            raise not_found(self, repo, revision)
        return Snapshot(repo, commit_id, _no_links(folder, folder / "snapshots" / commit_id))

    def exists(self, repo: str, revision: str | None = None) -> bool:
        folder = self._dir(check_repo_id(repo))
        if not (folder / "refs" / "main").is_file():
            return False
        return revision is None or self._find(folder, repo, check_revision(revision)) is not None

    def stream_urls(self, snapshot: Snapshot, paths: list[str]) -> tuple[list[str], dict]:
        folder = self._dir(check_repo_id(snapshot.repo))
        return [str(_inside(folder, snapshot.path / check_repo_path(p))) for p in paths], {}

    # -- internals --------------------------------------------------------------------------

    def _dir(self, repo: str) -> Path:
        return self.root / "datasets" / repo

    def _head(self, folder: Path) -> str:
        return _commit_id((folder / "refs" / "main").read_text().strip(), folder / "refs" / "main")

    def _record(self, folder: Path, commit_id: str) -> dict:
        path = folder / "commits" / f"{_commit_id(commit_id, folder / 'commits')}.json"
        return json.loads(_inside(folder, path).read_text())

    def _find(self, folder: Path, repo: str, revision: str) -> str | None:
        """The commit a revision names: main (the only branch), a full commit id, or a unique prefix of one.
        Only ids of 40 hex digits ever become file names, so no revision leads out of the repo folder."""
        if revision == "main":
            return self._head(folder)
        if _FULL_ID.fullmatch(revision) and (folder / "commits" / f"{revision}.json").is_file():
            return revision
        return expand_revision(revision, self.revisions(repo))

    @contextmanager
    def _locked(self, folder: Path) -> Iterator[None]:
        """One committer per repo at a time (readers never lock: what they read is immutable). An flock: a killed
        committer's dies with it; a wait of more than a few seconds names the committer (hubgym.files.locks)."""
        from hubgym.files.locks import exclusive

        with exclusive(folder / ".lock", f"a commit to {folder.relative_to(self.root)} by another process"):
            yield

    def _commit_locked(self, folder: Path, files: Mapping[str, FileSource], message: str, *, replace: bool) -> str:
        shutil.rmtree(folder / "tmp", ignore_errors=True)  # we hold the lock: anything staged there is abandoned
        (folder / "tmp").mkdir(parents=True)
        head = self._head(folder) if (folder / "refs" / "main").is_file() else None
        parent_tree = self._record(folder, head)["tree"] if head else {}
        tree = dict(parent_tree) if not replace else {k: v for k, v in parent_tree.items() if k == GITATTRIBUTES}
        for path, source in files.items():
            tree[_check_path(path)] = self._store_blob(folder, source)
        if head and tree == parent_tree:
            return head  # nothing changed: no empty commits
        record = {"parent": head, "message": message, "date": _now(), "tree": dict(sorted(tree.items()))}
        commit_id = hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()
        self._write_snapshot(folder, commit_id, record["tree"])
        _atomic_write(folder / "commits" / f"{commit_id}.json", json.dumps(record, indent=1).encode())
        _atomic_write(folder / "refs" / "main", commit_id.encode())  # the commit point
        return commit_id

    def _store_blob(self, folder: Path, source: FileSource) -> dict:
        """Copy a file into blobs/ (once per content) while hashing it; return its tree entry."""
        staged = folder / "tmp" / f"blob-{uuid.uuid4().hex}"
        digest, size = hashlib.sha256(), 0
        with open(staged, "wb") as out:
            for chunk in _chunks(source):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
        sha = digest.hexdigest()
        target = folder / "blobs" / sha
        if target.exists():
            staged.unlink()
        else:
            target.parent.mkdir(exist_ok=True)
            staged.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # blobs are immutable
            os.replace(staged, target)
        return {"sha256": sha, "size": size}

    def _write_snapshot(self, folder: Path, commit_id: str, tree: dict[str, dict]) -> None:
        final = folder / "snapshots" / commit_id
        if final.exists():
            return
        staging = folder / "tmp" / f"snapshot-{commit_id}"
        for path, entry in tree.items():
            target = staging / path
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(folder / "blobs" / entry["sha256"], target)
            except OSError:  # a filesystem without hard links: copy
                shutil.copyfile(folder / "blobs" / entry["sha256"], target)
        staging.mkdir(parents=True, exist_ok=True)  # an empty tree is still a snapshot
        final.parent.mkdir(exist_ok=True)
        os.rename(staging, final)


def _chunks(source: FileSource) -> Iterator[bytes]:
    if isinstance(source, bytes):
        yield source
        return
    with open(source, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


def _no_links(folder: Path, snapshot: Path) -> Path:
    """A snapshot folder that holds no symbolic link and stays inside the repo folder: what is read from it is
    what the hub stored (the local hub links nothing; a link means the folder was edited by hand)."""
    _inside(folder, snapshot)
    for parent, dirs, files in os.walk(snapshot):
        for name in dirs + files:
            if os.path.islink(os.path.join(parent, name)):
                _inside(folder, Path(parent) / name)  # raises if it leads out; a link inside is refused below
                raise EnvContractError(f"{Path(parent) / name} is a symbolic link; a local hub snapshot holds "
                                       f"only files", Where(field=name), "the local hub folder was edited by "
                                       "hand: remove the link, or push again to a new hub folder")
    return snapshot


_check_path = check_repo_path  # a commit never writes outside its snapshot


def _commit_id(value: str, source: Path) -> str:
    """A commit id read from the hub folder (refs/main, a commit's parent): 40 hex digits, or the folder was
    edited by hand; it becomes a file name, so nothing else may pass."""
    if not _FULL_ID.fullmatch(value):
        raise EnvContractError(f"{source} holds {value[:100]!r}, which is not a commit id", Where(field=str(source)),
                               "the local hub folder was edited by hand or is corrupt: restore it, or push again "
                               "to a new hub folder")
    return value


def _inside(folder: Path, path: Path) -> Path:
    """`path`, once it is sure to stay inside the repo folder when links are followed (the local hub makes none;
    a link that leads out of the repo means the folder was edited by hand)."""
    real, home = path.resolve(), folder.resolve()
    if real != home and home not in real.parents:
        raise EnvContractError(f"{path} leads outside its repo folder ({real})", Where(field=str(path)),
                               "the local hub folder was edited by hand: remove the link, or push again to a new "
                               "hub folder")
    return path


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
