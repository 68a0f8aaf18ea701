"""What an env reference is: the one name rule and the one parser of what users type.

    parse_ref("arithmetic")                  # EnvRef(kind="name", name="arithmetic")
    parse_ref("arithmetic-v1:easy")          # a versioned id, with a config
    parse_ref("./envs/count_vowels")         # kind "path": a folder holding builder.py, or a .py file
    parse_ref("org/arith@3f1c2e9:easy")      # kind "hub": repo, revision, config
    check_env_name("my-env")                 # EnvContractError: the rule, and how to fix the name

An env name (a builder's ENV, a row's `env`, an entry-point name, `hubgym init NAME`) is ENV_NAME_RULE:
it must be a Python identifier too, since it names an env folder, a verifier module and a class. A
versioned id is `<name>-v<N>`. A reference is one of those, a path, or a hub repo `org/name[@revision]`,
followed by `:CONFIG`. A bare word names a registered env first; a folder of that name is taken only when
no env is registered under it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hubgym.errors import EnvContractError, EnvNotFoundError, Where
from hubgym.schemas.tasks import ENV_NAME, ENV_NAME_RULE

ENV_ID = re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9_]{0,63})-v(?P<version>[1-9][0-9]{0,8})")
"""`<name>-v<N>`: an env at one version (a builder's env_id())."""

Kind = Literal["name", "path", "hub"]


def env_name_problem(name: object) -> str | None:
    """Why `name` is not an env name (the end of a sentence), or None when it is one."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if ENV_ID.fullmatch(name):
        return "ends in -v<N>, which is the version's place (set ENV_VERSION instead)"
    if not ENV_NAME.fullmatch(name):
        return f"breaks the rule for env names: {ENV_NAME_RULE}"
    return None


def check_env_name(name: object, field: str = "ENV") -> str:
    """`name` when it is an env name; else one EnvContractError naming the value, the rule and a fix."""
    problem = env_name_problem(name)
    if problem is not None:
        suggestion = re.sub(r"[^A-Za-z0-9_]", "_", str(name)).lstrip("_0123456789")[:64] or "my_env"
        raise EnvContractError(f"env name {str(name)[:100]!r} {problem}", Where(env=str(name)[:100], field=field),
                               f"name it with {ENV_NAME_RULE}, e.g. {suggestion!r}")
    return name  # type: ignore[return-value]


def split_version(text: str) -> tuple[str, int | None]:
    """`arithmetic-v1` -> ("arithmetic", 1); a plain name -> (name, None)."""
    match = ENV_ID.fullmatch(text)
    return (match["name"], int(match["version"])) if match else (text, None)


@dataclass(frozen=True)
class EnvRef:
    """One parsed env reference. `str(ref)` gives the text back (config included)."""

    text: str  # the reference without its config, as given
    kind: Kind
    config: str | None = None
    name: str | None = None  # kind "name": the env name (version split off)
    version: int | None = None  # kind "name": the version a versioned id asks for
    path: Path | None = None  # kind "path"
    repo: str | None = None  # kind "hub": org/name
    revision: str | None = None  # kind "hub": as given (a branch, tag or commit), None for the head

    def __str__(self) -> str:
        return self.text + (f":{self.config}" if self.config else "")

    def with_config(self, config: str | None) -> EnvRef:
        return EnvRef(self.text, self.kind, config, self.name, self.version, self.path, self.repo, self.revision)


def parse_ref(spec: str | os.PathLike[str], config: str | None = None) -> EnvRef:
    """Parse `ENV[:CONFIG]` (see the module docstring); `config`, when given, is the config asked for apart.
    A reference that is none of the forms is one EnvNotFoundError listing them."""
    text = os.fspath(spec)
    if not isinstance(text, str) or not text.strip():
        raise EnvNotFoundError(f"{text!r} is not an env reference; {FORMS}")
    head, _, given = text.partition(":")
    if not head.strip():  # ":hard" would read as the current folder
        raise EnvNotFoundError(f"{text[:100]!r} names no env before its ':'; {FORMS}")
    config = config or given or None
    if _is_path(head):
        return EnvRef(head, "path", config, path=Path(head).expanduser())
    if "/" in head:
        from hubgym.hub.base import parse_ref as parse_repo_ref

        repo, revision = parse_repo_ref(head)  # the Hub's own rules for repo ids and revisions
        return EnvRef(head, "hub", config, repo=repo, revision=revision)
    name, version = split_version(head)
    if env_name_problem(name) is not None:
        raise EnvNotFoundError(f"{head[:100]!r} is not an env reference: an env name is {ENV_NAME_RULE}; {FORMS}")
    return EnvRef(head, "name", config, name=name, version=version)


FORMS = ("give an env name or versioned id (arithmetic, arithmetic-v1), a folder holding builder.py or a .py file, "
         "or a hub env org/name[@revision], each optionally followed by :CONFIG")


def _is_path(head: str) -> bool:
    """A path: starts like one, names a .py file, or is an existing folder that no registered env shadows (a bare
    word names a registered env first). `org/name` that exists on disk is a path too."""
    if head.startswith((".", "/", "~")) or head.endswith(".py"):
        return True
    if not Path(head).exists():
        return False
    if "/" in head:
        return True
    from hubgym.builders.registry import is_registered

    return not is_registered(head)
