"""The Hugging Face Hub (or any server speaking its API) as a hub backend, through huggingface_hub.

    hub = HfHub()                          # endpoint from HF_ENDPOINT, token from HF_TOKEN or `hf auth login`
    hub = HfHub(endpoint="http://127.0.0.1:8080", token=..., retries=3)

A commit is one `create_commit` (atomic on the server: the branch moves only when the whole
commit is in). Transient failures (dropped connections, 5xx, a concurrent push moving the head)
are retried; a retry recomputes the commit against the current head, and files the server
already holds are skipped, so a commit whose answer was lost is not committed twice.

The token is never printed: it is kept out of reprs and scrubbed from every error message.
Against a server that is not huggingface.co set HF_HUB_DISABLE_XET=1 (uploads then use LFS).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Mapping, TypeVar

import httpx2
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, constants, get_token, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError, LocalEntryNotFoundError, LocalTokenNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile

from hubgym.errors import HubAuthError, HubConnectionError
from hubgym.hub.base import (
    GITATTRIBUTES, FileSource, HubBackend, Revision, Snapshot, expand_revision, is_short_commit, not_found,
)
from hubgym.hub.names import check_repo_id, check_repo_path, check_revision

T = TypeVar("T")
REPO_TYPE = "dataset"
_TRANSIENT_STATUS = (408, 409, 412, 429, 500, 502, 503, 504)  # 409/412: another push moved the head meanwhile


class HfHub(HubBackend):
    """Env and rollout repos as dataset repos on the Hugging Face Hub."""

    name = "hf"

    def __init__(self, endpoint: str | None = None, token: str | None = None, *,
                 cache_dir: str | os.PathLike | None = None, retries: int = 3, backoff_s: float = 1.0):
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self._token = token
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.retries, self.backoff_s = retries, backoff_s

    def __repr__(self) -> str:  # never the token
        return f"HfHub(endpoint={self.endpoint!r})"

    def location(self, repo: str) -> str:
        return f"{self.endpoint}/datasets/{repo}"

    def spec(self) -> str:
        return self.endpoint

    @property
    def token(self) -> str | None:
        return self._token or os.environ.get("HF_TOKEN") or get_token()

    def _token_source(self) -> str | None:
        if self._token:
            return "the token argument"
        if os.environ.get("HF_TOKEN"):
            return "HF_TOKEN"
        return "the stored login (`hf auth login`)" if get_token() else None

    @property
    def api(self) -> HfApi:
        return HfApi(endpoint=self.endpoint, token=self.token or False, library_name="hubgym")

    # -- the interface ----------------------------------------------------------------------

    def create_repo(self, repo: str) -> None:
        check_repo_id(repo)
        self._call(lambda: self.api.create_repo(repo, repo_type=REPO_TYPE, exist_ok=True), f"create {repo}",
                   repo, write=True)

    def commit(self, repo: str, files: Mapping[str, FileSource], message: str, *, replace: bool = False) -> str:
        check_repo_id(repo)
        return self._call(lambda: self._commit_once(repo, files, message, replace), f"push to {repo}", repo, write=True)

    def revisions(self, repo: str) -> list[Revision]:
        check_repo_id(repo)
        commits = self._call(lambda: self.api.list_repo_commits(repo, repo_type=REPO_TYPE), f"list {repo}", repo)
        return [Revision(c.commit_id, c.title, c.created_at.isoformat()) for c in commits]

    def resolve(self, repo: str, revision: str | None = None, *, patterns: list[str] | None = None) -> Snapshot:
        check_repo_id(repo)
        revision = self._expand(repo, check_revision(revision or "main"))
        path = self._call(lambda: snapshot_download(
            repo, repo_type=REPO_TYPE, revision=revision, cache_dir=self.cache_dir, endpoint=self.endpoint,
            token=self.token or False, allow_patterns=patterns), f"download {repo}@{revision}", repo, revision)
        return Snapshot(repo, Path(path).name, Path(path))

    def exists(self, repo: str, revision: str | None = None) -> bool:
        check_repo_id(repo)
        if revision is None:
            return self._call(lambda: self.api.repo_exists(repo, repo_type=REPO_TYPE), f"look up {repo}", repo)
        revision = self._expand(repo, check_revision(revision))
        return self._call(lambda: self.api.revision_exists(repo, revision, repo_type=REPO_TYPE),
                          f"look up {repo}@{revision}", repo)

    def stream_urls(self, snapshot: Snapshot, paths: list[str]) -> tuple[list[str], dict]:
        """Pinned `hf://` URLs (read in ranges, never downloaded whole) and the load_dataset arguments to open them."""
        urls = [f"hf://datasets/{snapshot.repo}@{snapshot.revision}/{check_repo_path(p)}" for p in paths]
        token = self.token or False  # load_dataset puts its own `token` into the hf options: pass it both ways
        return urls, {"token": token, "storage_options": {"hf": {"endpoint": self.endpoint, "token": token}}}

    # -- internals --------------------------------------------------------------------------

    def _expand(self, repo: str, revision: str) -> str:
        """A short commit id -> the full one, from the main branch's commits (as the Hub resolves it); any other
        revision, or a prefix no commit of main has, is left for the server to resolve."""
        if not is_short_commit(revision):
            return revision
        return expand_revision(revision, self.revisions(repo)) or revision

    def _commit_once(self, repo: str, files: Mapping[str, FileSource], message: str, replace: bool) -> str:
        api = self.api
        head = api.repo_info(repo, repo_type=REPO_TYPE, revision="main").sha
        operations: list = [CommitOperationAdd(path, source if isinstance(source, bytes) else str(source))
                            for path, source in files.items()]
        if replace:
            present = [f.path for f in api.list_repo_tree(repo, repo_type=REPO_TYPE, revision=head, recursive=True)
                       if isinstance(f, RepoFile)]
            operations += [CommitOperationDelete(p) for p in present if p not in files and p != GITATTRIBUTES]
        info = api.create_commit(repo, operations, commit_message=message, repo_type=REPO_TYPE, parent_commit=head)
        return info.oid

    def _call(self, fn: Callable[[], T], what: str, repo: str, revision: str | None = None, *,
              write: bool = False) -> T:
        """Run one client call: retry transient failures (writes only), turn the rest into hubgym errors."""
        attempt = 1
        while True:
            try:
                return fn()
            except Exception as exc:
                if not (write and _transient(exc)) or attempt > self.retries:
                    raise self._translate(exc, what, repo, revision, write, attempt) from None
            time.sleep(self.backoff_s * 2 ** (attempt - 1))
            attempt += 1

    def _translate(self, exc: Exception, what: str, repo: str, revision: str | None, write: bool,
                   attempts: int) -> Exception:
        status = _status(exc)
        if isinstance(exc, RevisionNotFoundError):
            return not_found(self, repo, revision)
        if isinstance(exc, LocalTokenNotFoundError) or (status in (401, 403) and (write or self.token)):
            return HubAuthError(self._auth_message(what, status, write))
        if isinstance(exc, RepositoryNotFoundError) or status == 404:
            error = not_found(self, repo)
            if status == 401:
                error.args = (error.args[0] + "; if the repo is private, set HF_TOKEN or run `hf auth login`",)
            return error
        if isinstance(exc, OfflineModeIsEnabled):
            return HubConnectionError(f"cannot {what}: HF_HUB_OFFLINE is set. Unset it, or use the local hub "
                                      f"(HUBGYM_HUB=<folder>)")
        if _transient(exc) or isinstance(exc, (LocalEntryNotFoundError, httpx2.TransportError, ConnectionError)):
            tries = f" after {attempts} attempts" if attempts > 1 else ""
            advice = ("The repo's previous revision is unchanged; check the network and push again" if write else
                      "Check the network and HF_ENDPOINT, or load a revision you already have through the local hub")
            reason = self._redact(_reason(exc))
            return HubConnectionError(f"cannot {what} at {self.endpoint}{tries}: {reason}. {advice}")
        token = self.token
        if token and token in str(exc):  # never seen from huggingface_hub, but a message must not carry the token
            return (type(exc) if _rebuildable(exc) else RuntimeError)(self._redact(str(exc)))
        return exc

    def _auth_message(self, what: str, status: int | None, write: bool) -> str:
        source, access = self._token_source(), "write access" if write else "read access to the repo"
        code = f" ({status})" if status else ""
        if source is None:
            return (f"cannot {what}: the hub at {self.endpoint} needs credentials{code} and none were found. "
                    f"Set HF_TOKEN to a token with {access}, or run `hf auth login`")
        return (f"cannot {what}: the hub at {self.endpoint} refused the token from {source}{code}. Check that it is "
                f"valid and has {access} (the token is not shown)")

    def _redact(self, text: str) -> str:
        token = self.token
        return text.replace(token, "hf_***") if token else text


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _status(exc: BaseException) -> int | None:
    for e in _chain(exc):
        response = getattr(e, "response", None)
        if isinstance(e, HfHubHTTPError) and response is not None:
            return response.status_code
    return None


def _transient(exc: BaseException) -> bool:
    """A dropped connection, a timeout, or a status worth retrying, anywhere in the exception chain."""
    return any(isinstance(e, httpx2.TransportError) for e in _chain(exc)) or _status(exc) in _TRANSIENT_STATUS


def _reason(exc: BaseException) -> str:
    for e in _chain(exc):
        if isinstance(e, httpx2.TransportError):
            return f"{type(e).__name__}: {e}"
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def _rebuildable(exc: Exception) -> bool:
    """Whether `type(exc)(message)` rebuilds it (so a redacted copy can be raised in its place)."""
    return type(exc) in (ValueError, RuntimeError, OSError, TypeError)
