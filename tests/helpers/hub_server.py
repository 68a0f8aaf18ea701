"""A loopback server that speaks the Hugging Face Hub API, for tests (a fixture, not part of hubgym).

The real `huggingface_hub` and `datasets` clients talk HTTP to it. It keeps an on-disk store with
git-like revisions: every commit is immutable, its id is the sha1 of its content (parent, tree,
message, time), and a branch ref moves only after the whole commit is written, so a failed commit
leaves the previous revision untouched.

Routes (those the clients use with xet disabled):
    POST /api/repos/create                          GET  /api/{type}s/{id}[/revision/{rev}]
    GET  /api/{type}s/{id}/tree/{rev}[/{path}]      POST /api/{type}s/{id}/paths-info/{rev}
    POST /api/{type}s/{id}/preupload/{rev}          POST /api/{type}s/{id}/commit/{rev}   (NDJSON)
    GET  /api/{type}s/{id}/commits/{rev}            GET  /api/{type}s/{id}/refs
    POST [{type}s/]{id}.git/info/lfs/objects/batch  PUT  /lfs-upload/{sha256}  (the presigned target)
    HEAD|GET [{type}s/]{id}/resolve/{rev}/{path}    POST /api/validate-yaml
    GET  /api/whoami-v2                             GET  /api/agent-harnesses  (404)

Faults: `server.drop("commit", count=2)` closes the connection on the next two commits without
answering (`when="after"` applies the commit first, so only the answer is lost); "upload" drops a
PUT half-way through its body. With `server.token` set, every API request needs
`Authorization: Bearer <token>` (401 otherwise), as a private Hub would.

The fixtures `hub_server`, `hub_client` and `hub_spec` are there for every test: tests/conftest.py loads this
module as a plugin (`pytest_plugins = ["helpers.hub_server"]`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import threading
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
GITATTRIBUTES = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n*.arrow filter=lfs diff=lfs merge=lfs -text\n"
LFS_SUFFIXES = (".parquet", ".arrow", ".bin", ".safetensors")


class HttpError(Exception):
    """An HTTP error answer, with the Hub's `X-Error-Code` / `X-Error-Message` headers."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def git_oid(data: bytes) -> str:
    """The git blob id: sha1 of `blob <size>\\0<data>` (what the Hub reports for regular files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# -- the store --------------------------------------------------------------------------------------


class HubStore:
    """Repos on disk: `blobs/<sha256>`, and per repo `refs.json` plus one immutable JSON file per commit."""

    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()

    # blobs
    def put_blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        path = self.root / "blobs" / sha
        if not path.exists():
            _atomic_write(path, data)
        return sha

    def regular_entry(self, data: bytes) -> dict:
        return {"sha256": self.put_blob(data), "size": len(data), "lfs": False, "oid": git_oid(data)}

    def has_blob(self, sha256: str) -> bool:
        return (self.root / "blobs" / sha256).is_file()

    def blob(self, sha256: str) -> bytes:
        return (self.root / "blobs" / sha256).read_bytes()

    # repos
    def repo_dir(self, repo_type: str, repo_id: str) -> Path:
        return self.root / "repos" / repo_type / repo_id

    def exists(self, repo_type: str, repo_id: str) -> bool:
        return (self.repo_dir(repo_type, repo_id) / "refs.json").is_file()

    def create(self, repo_type: str, repo_id: str) -> bool:
        """Create a repo with an initial commit holding `.gitattributes` (as the Hub does). False if it exists."""
        with self.lock:
            if self.exists(repo_type, repo_id):
                return False
            (self.repo_dir(repo_type, repo_id) / "commits").mkdir(parents=True, exist_ok=True)
            _atomic_write(self.repo_dir(repo_type, repo_id) / "refs.json", b"{}")
        self.commit(repo_type, repo_id, "main", {".gitattributes": self.regular_entry(GITATTRIBUTES)}, [],
                    "initial commit", "", None)
        return True

    def refs(self, repo_type: str, repo_id: str) -> dict[str, str]:
        return json.loads((self.repo_dir(repo_type, repo_id) / "refs.json").read_text())

    def load_commit(self, repo_type: str, repo_id: str, sha: str) -> dict:
        return json.loads((self.repo_dir(repo_type, repo_id) / "commits" / f"{sha}.json").read_text())

    def resolve(self, repo_type: str, repo_id: str, revision: str) -> str:
        """A branch name or a full commit id -> the commit id (404 RepoNotFound / RevisionNotFound)."""
        if not self.exists(repo_type, repo_id):
            raise HttpError(404, f"Repository {repo_id} not found", "RepoNotFound")
        refs = self.refs(repo_type, repo_id)
        if revision in refs:
            return refs[revision]
        commit_file = self.repo_dir(repo_type, repo_id) / "commits" / f"{revision}.json"
        if re.fullmatch(r"[0-9a-f]{40}", revision) and commit_file.is_file():
            return revision
        raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def tree(self, repo_type: str, repo_id: str, sha: str) -> dict[str, dict]:
        return self.load_commit(repo_type, repo_id, sha)["tree"]

    def commit(self, repo_type: str, repo_id: str, branch: str, adds: dict[str, dict], deletes: list[str],
               summary: str, description: str, parent_expected: str | None) -> str:
        """Apply adds/deletes on the branch head; write the commit file, then move the ref (atomic)."""
        with self.lock:
            refs = self.refs(repo_type, repo_id)
            parent = refs.get(branch)
            if parent_expected is not None and parent_expected != parent:
                raise HttpError(412, f"parent commit {parent_expected} is not the head {parent}")
            tree = dict(self.tree(repo_type, repo_id, parent)) if parent else {}
            for path in deletes:
                gone = [p for p in tree if p == path.rstrip("/") or p.startswith(path.rstrip("/") + "/")]
                if not gone:
                    raise HttpError(404, "A file with this name doesn't exist", "EntryNotFound")
                for p in gone:
                    del tree[p]
            tree.update(adds)
            record = {"parent": parent, "tree": dict(sorted(tree.items())), "summary": summary,
                      "description": description, "date": now_iso()}
            sha = hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()
            _atomic_write(self.repo_dir(repo_type, repo_id) / "commits" / f"{sha}.json", json.dumps(record).encode())
            _atomic_write(self.repo_dir(repo_type, repo_id) / "refs.json", json.dumps({**refs, branch: sha}).encode())
            return sha

    def history(self, repo_type: str, repo_id: str, sha: str) -> list[tuple[str, dict]]:
        out = []
        while sha:
            record = self.load_commit(repo_type, repo_id, sha)
            out.append((sha, record))
            sha = record["parent"]
        return out


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# -- entries as the API shows them ------------------------------------------------------------------


def file_entry(path: str, entry: dict) -> dict:
    if entry["lfs"]:
        pointer = lfs_pointer(entry["sha256"], entry["size"])
        return {"type": "file", "path": path, "size": entry["size"], "oid": git_oid(pointer),
                "lfs": {"oid": entry["sha256"], "size": entry["size"], "pointerSize": len(pointer)}}
    return {"type": "file", "path": path, "size": entry["size"], "oid": entry["oid"]}


def folder_entry(path: str, tree: dict[str, dict]) -> dict:
    inside = sorted(p for p in tree if p.startswith(path + "/"))
    return {"type": "directory", "path": path, "size": 0,
            "oid": hashlib.sha1(json.dumps([[p, tree[p]["sha256"]] for p in inside]).encode()).hexdigest()}


def folders_of(tree: dict[str, dict]) -> set[str]:
    return {"/".join(p.split("/")[:i]) for p in tree for i in range(1, p.count("/") + 1)}


def list_tree(tree: dict[str, dict], base: str, recursive: bool) -> list[dict]:
    base = base.strip("/")
    prefix = base + "/" if base else ""
    if base and base not in folders_of(tree):
        raise HttpError(404, f"{base} does not exist on this revision", "EntryNotFound")
    out = []
    for folder in sorted(folders_of(tree)):
        rest = folder[len(prefix):]
        if folder.startswith(prefix) and rest and (recursive or "/" not in rest):
            out.append(folder_entry(folder, tree))
    for path in sorted(tree):
        rest = path[len(prefix):]
        if path.startswith(prefix) and (recursive or "/" not in rest):
            out.append(file_entry(path, tree[path]))
    return out


# -- faults -----------------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str  # "commit" | "upload" | "any"
    count: int  # how many matching requests to drop
    skip: int = 0  # matching requests to let through first
    when: str = "before"  # commit only: "before" (not applied) or "after" (applied, answer lost)


# -- the server -------------------------------------------------------------------------------------


@dataclass
class HubServer:
    """A threaded loopback Hub. `url` is its endpoint; `requests` logs (method, path) of every request."""

    root: Path
    token: str | None = None
    faults: list[Fault] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # tracebacks of fixture bugs (answered 500)

    def __post_init__(self):
        self.store = HubStore(self.root)
        self.upload_key = hashlib.sha256(os.urandom(16)).hexdigest()[:16]
        self._httpd: _TrackingServer | None = None

    def start(self) -> "HubServer":
        handler = type("BoundHandler", (HubHandler,), {"hub": self})
        self._httpd = _TrackingServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open (keep-alive) connection: the hub is gone, as if unplugged."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd.close_all()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]  # type: ignore[union-attr]
        return f"http://{host}:{port}"

    def drop(self, kind: str, count: int = 1, *, skip: int = 0, when: str = "before") -> None:
        """Close the connection without an answer on the next `count` requests of `kind` (after `skip`)."""
        self.faults.append(Fault(kind, count, skip, when))

    def take_fault(self, kind: str) -> Fault | None:
        with self.store.lock:
            for fault in self.faults:
                if fault.kind in (kind, "any") and fault.count > 0:
                    if fault.skip > 0:
                        fault.skip -= 1
                        return None
                    fault.count -= 1
                    return fault
        return None

    def count(self, method: str, pattern: str) -> int:
        return sum(1 for m, p in self.requests if m == method and re.search(pattern, p))


class _TrackingServer(ThreadingHTTPServer):
    """A threaded HTTP server that remembers its open connections, so `stop` can cut them."""

    daemon_threads = True

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.connections: set[socket.socket] = set()

    def process_request(self, request, client_address):
        self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        self.connections.discard(request)
        super().shutdown_request(request)

    def close_all(self) -> None:
        for connection in list(self.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Drop(Exception):
    """Raised inside a handler to close the connection without answering."""


class HubHandler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read `hub.requests` instead
        return

    # -- plumbing ---------------------------------------------------------------------------------

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self._body_read = False  # one handler serves every request of a keep-alive connection
        self.query = parse_qs(url.query)
        segments = [unquote(s) for s in url.path.split("/")[1:]]
        self.hub.requests.append((method, url.path))
        try:
            self._check_auth(segments)
            self._route(method, segments)
        except Drop:
            self.hub.dropped.append((method, url.path))
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        except HttpError as err:
            self._read_body()
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            self._json({"error": err.message}, err.status, headers)
        except Exception as exc:  # a bug in this fixture: answer 500 and keep it for the test to show
            self.hub.errors.append(traceback.format_exc())
            self._json({"error": f"{type(exc).__name__}: {exc}"}, 500)

    def _check_auth(self, segments: list[str]) -> None:
        if self.hub.token is None or segments[:1] == ["lfs-upload"] or segments[:2] == ["api", "agent-harnesses"]:
            return
        given = self.headers.get("Authorization", "")
        if not given:
            raise HttpError(401, "Invalid username or password.")
        if given != f"Bearer {self.hub.token}":
            raise HttpError(401, "Invalid credentials in Authorization header")

    def _read_body(self, limit: int | None = None) -> bytes:
        if getattr(self, "_body_read", False):
            return b""
        self._body_read = True
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked(limit)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(length, limit) if limit is not None else length)

    def _read_chunked(self, limit: int | None) -> bytes:
        out = bytearray()
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return bytes(out)
            out += self.rfile.read(size)
            self.rfile.readline()
            if limit is not None and len(out) >= limit:
                return bytes(out)

    def _json_body(self) -> Any:
        body = self._read_body()
        return json.loads(body) if body else {}

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            # HTTP headers are latin-1: other characters (a revision named in X-Error-Message) go escaped
            self.send_header(key, value.encode("latin-1", "backslashreplace").decode("latin-1"))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, value: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})},
                   head=self.command == "HEAD")

    # -- routing ----------------------------------------------------------------------------------

    def _route(self, method: str, s: list[str]) -> None:
        if s[:2] == ["api", "repos"] and s[2:] == ["create"] and method == "POST":
            return self._create_repo()
        if s == ["api", "validate-yaml"] and method == "POST":
            self._read_body()
            return self._json({"errors": [], "warnings": []})
        if s == ["api", "whoami-v2"]:
            return self._json({"type": "user", "name": "tester", "auth": {"accessToken": {"role": "write"}}})
        if s[:1] == ["api"] and len(s) >= 4 and s[1] in REPO_TYPES:
            return self._api_repo(method, REPO_TYPES[s[1]], f"{s[2]}/{s[3]}", s[4:])
        if s[:1] == ["lfs-upload"] and method == "PUT":
            return self._lfs_put(s[1])
        prefix = {"datasets": "dataset", "spaces": "space"}.get(s[0] if s else "")
        repo_type, rest = (prefix, s[1:]) if prefix else ("model", s)
        if len(rest) >= 5 and rest[1].endswith(".git") and rest[2:] == ["info", "lfs", "objects", "batch"]:
            return self._lfs_batch(repo_type, f"{rest[0]}/{rest[1][:-4]}")
        if len(rest) >= 5 and rest[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(method, repo_type, f"{rest[0]}/{rest[1]}", rest[3], "/".join(rest[4:]))
        raise HttpError(404, f"no route for {method} {self.path}")

    def _api_repo(self, method: str, repo_type: str, repo_id: str, rest: list[str]) -> None:
        store = self.hub.store
        if not rest and method == "GET":
            return self._info(repo_type, repo_id, "main")
        action, rev = (rest[0], rest[1]) if len(rest) >= 2 else (rest[0] if rest else "", "main")
        if action == "revision" and method == "GET":
            return self._info(repo_type, repo_id, rev)
        if action == "refs" and method == "GET":
            refs = store.refs(repo_type, repo_id) if store.exists(repo_type, repo_id) else None
            if refs is None:
                raise HttpError(404, f"Repository {repo_id} not found", "RepoNotFound")
            branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": c} for b, c in refs.items()]
            return self._json({"branches": branches, "tags": [], "converts": []})
        sha = store.resolve(repo_type, repo_id, rev)
        if action == "tree" and method == "GET":
            recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
            return self._json(list_tree(store.tree(repo_type, repo_id, sha), "/".join(rest[2:]), recursive))
        if action == "paths-info" and method == "POST":
            return self._paths_info(store.tree(repo_type, repo_id, sha))
        if action == "preupload" and method == "POST":
            return self._preupload(store.tree(repo_type, repo_id, sha))
        if action == "commits" and method == "GET":
            return self._json([{"id": c, "title": r["summary"], "message": r["description"], "date": r["date"],
                                "authors": [{"user": "tester"}]} for c, r in store.history(repo_type, repo_id, sha)])
        if action == "commit" and method == "POST":
            return self._commit(repo_type, repo_id, rev)
        raise HttpError(404, f"no route for {method} {self.path}")

    # -- handlers ---------------------------------------------------------------------------------

    def _create_repo(self) -> None:
        body = self._json_body()
        repo_type = body.get("type") or "model"
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else f"tester/{body['name']}"
        url = f"{self.hub.url}/{URL_PREFIX[repo_type]}{repo_id}"
        if not self.hub.store.create(repo_type, repo_id):  # the Hub names the existing repo in its 409
            return self._json({"error": "You already created this dataset repo", "url": url}, 409)
        self._json({"url": url, "name": repo_id})

    def _info(self, repo_type: str, repo_id: str, rev: str) -> None:
        store = self.hub.store
        sha = store.resolve(repo_type, repo_id, rev)
        record = store.load_commit(repo_type, repo_id, sha)
        siblings = [{"rfilename": p, "size": e["size"]} for p, e in sorted(record["tree"].items())]
        self._json({"_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id,
                    "author": repo_id.split("/")[0], "sha": sha, "lastModified": record["date"],
                    "createdAt": record["date"], "private": False, "gated": False, "disabled": False, "downloads": 0,
                    "likes": 0, "tags": [], "siblings": siblings})

    def _paths_info(self, tree: dict[str, dict]) -> None:
        body = self._read_body().decode()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = json.loads(body).get("paths", [])
        else:
            paths = parse_qs(body).get("paths", [])
        folders = folders_of(tree)
        out = []
        for path in paths:
            path = path.strip("/")
            if path in tree:
                out.append(file_entry(path, tree[path]))
            elif path in folders:
                out.append(folder_entry(path, tree))
        self._json(out)

    def _preupload(self, tree: dict[str, dict]) -> None:
        files = []
        for f in self._json_body().get("files", []):
            lfs = f["path"].endswith(LFS_SUFFIXES) or f["size"] > 10 * 2**20
            old = tree.get(f["path"])
            oid = None if old is None else (old["sha256"] if old["lfs"] else old["oid"])
            files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                          "oid": oid})
        self._json({"files": files, "commitOid": None})

    def _lfs_batch(self, repo_type: str, repo_id: str) -> None:
        if not self.hub.store.exists(repo_type, repo_id):
            raise HttpError(404, f"Repository {repo_id} not found", "RepoNotFound")
        objects = []
        for obj in self._json_body().get("objects", []):
            out = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if not self.hub.store.has_blob(obj["oid"]):
                href = f"{self.hub.url}/lfs-upload/{obj['oid']}?key={self.hub.upload_key}"
                out["actions"] = {"upload": {"href": href, "header": {}}}
            objects.append(out)
        self._json({"transfer": "basic", "objects": objects})

    def _lfs_put(self, oid: str) -> None:
        if self.query.get("key") != [self.hub.upload_key]:
            raise HttpError(403, "bad upload signature")
        if self.hub.take_fault("upload") is not None:
            self._read_body(limit=max(1, int(self.headers.get("Content-Length") or 2) // 2))
            raise Drop()
        data = self._read_body()
        if hashlib.sha256(data).hexdigest() != oid:
            raise HttpError(400, "uploaded content does not match its sha256")
        self.hub.store.put_blob(data)
        self._send(200, b"", {"ETag": f'"{oid}"'})

    def _commit(self, repo_type: str, repo_id: str, branch: str) -> None:
        lines = [json.loads(line) for line in self._read_body().splitlines() if line.strip()]
        fault = self.hub.take_fault("commit")
        if fault is not None and fault.when == "before":
            raise Drop()
        store = self.hub.store
        if branch not in store.refs(repo_type, repo_id):
            raise HttpError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
        header, adds, deletes = {}, {}, []
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "header":
                header = value
            elif key == "file":
                adds[value["path"]] = store.regular_entry(base64.b64decode(value["content"]))
            elif key == "lfsFile":
                if not store.has_blob(value["oid"]):
                    raise HttpError(422, f"LFS object {value['oid']} for {value['path']} was not uploaded")
                adds[value["path"]] = {"sha256": value["oid"], "size": len(store.blob(value["oid"])), "lfs": True}
            elif key in ("deletedFile", "deletedFolder"):
                deletes.append(value["path"])
            else:
                raise HttpError(400, f"unknown commit operation {key!r}")
        sha = store.commit(repo_type, repo_id, branch, adds, deletes, header.get("summary", ""),
                           header.get("description", ""), header.get("parentCommit"))
        if fault is not None:  # when == "after": applied, but the answer is lost
            raise Drop()
        self._json({"success": True, "commitOid": sha, "pullRequestUrl": None, "hookOutput": "",
                    "commitUrl": f"{self.hub.url}/{URL_PREFIX[repo_type]}{repo_id}/commit/{sha}"})

    def _resolve(self, method: str, repo_type: str, repo_id: str, rev: str, path: str) -> None:
        store = self.hub.store
        sha = store.resolve(repo_type, repo_id, rev)
        entry = store.tree(repo_type, repo_id, sha).get(path)
        if entry is None:
            raise HttpError(404, f"{path} does not exist on {rev}", "EntryNotFound")
        data = store.blob(entry["sha256"])
        listed = file_entry(path, entry)
        headers = {"ETag": f'"{listed["oid"]}"', "X-Repo-Commit": sha, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if entry["lfs"]:
            headers.update({"X-Linked-Etag": f'"{entry["sha256"]}"', "X-Linked-Size": str(entry["size"])})
        status, body = 200, data
        ranged = _parse_range(self.headers.get("Range"), len(data))
        if ranged is not None:
            start, end = ranged
            status, body = 206, data[start:end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self._send(status, body, headers, head=method == "HEAD")


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[len("bytes="):].split(",")[0].partition("-")
    if first == "":
        return max(0, size - int(last)), size - 1
    return int(first), min(int(last), size - 1) if last else size - 1


# -- pytest fixtures --------------------------------------------------------------------------------


@pytest.fixture
def hub_server(tmp_path):
    """A fresh loopback Hub for one test (its store under tmp_path)."""
    server = HubServer(tmp_path / "hub-server-store").start()
    yield server
    server.stop()


@pytest.fixture
def hub_client(hub_server, monkeypatch, tmp_path):
    """Point the real huggingface_hub and datasets clients at `hub_server`, online, xet off, private caches.

    The caches keep the clients' default layout (HF_HOME and HF_HUB_CACHE name a temp folder; downloads land
    as `snapshots/<commit>/<file>` links into `blobs/`, as on a user's machine). Both libraries read these
    variables at import, so their module constants are patched too (undone after the test; other tests stay
    offline); subprocesses get them from the environment.
    """
    import datasets.config
    from huggingface_hub import constants

    url, home = hub_server.url, tmp_path / "hf-home"
    for key, value in {"HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(home),
                       "HF_HUB_CACHE": str(tmp_path / "hf-hub-cache"), "HF_HUB_DISABLE_TELEMETRY": "1",
                       "HF_TOKEN_PATH": str(tmp_path / "no-stored-token")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-stored-token"))
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-hub-cache"))
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", url)
    monkeypatch.setattr(datasets.config, "HUB_DATASETS_URL", url + "/datasets/{repo_id}/resolve/{revision}/{path}")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")
    yield hub_server


TOKEN = "hf_loopbackSecretToken123456"  # the token tests hand to the clients of a hub_server that requires one


@pytest.fixture(params=["local", "http"])
def hub_spec(request, tmp_path, monkeypatch) -> str:
    """Each hub backend in turn, as `get_hub` takes it: a local hub folder, then the loopback Hub-API server
    (the Hugging Face backend) requiring TOKEN, which HF_TOKEN holds."""
    if request.param == "local":
        return str(tmp_path / "hub")
    client = request.getfixturevalue("hub_client")
    client.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return client.url
