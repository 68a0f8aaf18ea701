"""Names that reach paths and URLs, checked by the Hub's own rules before they are used.

    check_repo_id("org/name")          # huggingface_hub's repo-id rules, with the owner required
    check_revision("main")             # git's branch and tag name rules (what the Hub stores), or a commit id
    check_name("easy", "config name")  # one safe folder name that is also a `datasets` config name
    check_repo_path("data/x.parquet")  # a relative path inside a repo
    normalize_pin("sha256:9f2c...")    # a pin (an env's code sha256) -> its 64 hex digits

Each refusal is one error (one line, whatever the value holds) naming the value, cut when long, and the
rule it breaks. The rules are stricter than any path join needs: a name that passes is one folder or
one URL segment, never '.', '..', absolute, or carrying a separator, control character or NUL.
"""

from __future__ import annotations

import re

from hubgym.errors import EnvContractError, EnvNotFoundError, VerifierNotTrustedError, Where

_NAME_CHARS = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
_EDGE = re.compile(r"[A-Za-z0-9_]", re.ASCII)
_HEX = re.compile(r"[0-9a-f]{7,40}")
_PIN = re.compile(r"^(?:sha256:)?([0-9a-f]{64})$")
_REF_FORBIDDEN = "~^:?*[\\"  # git check-ref-format: never in a branch or tag name
MAX_NAME = 96  # the Hub's limit for each part of a repo id (huggingface_hub.utils.validate_repo_id)
MAX_REVISION = 255  # a revision becomes a file name in the client's cache (refs/<revision>)


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


def normalize_pin(pin: str) -> str:
    """'sha256:<64 hex>' or '<64 hex>' -> the hex digest."""
    match = _PIN.match(str(pin).strip().lower())
    if match is None:
        raise VerifierNotTrustedError(f"pin {str(pin)[:100]!r} is not a sha256; write it as sha256:<64 hex digits> "
                                      f"(the refusal message of an unpinned load shows it)", pinned=str(pin)[:100])
    return match.group(1)
