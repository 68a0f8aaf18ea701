"""Which verifier re-scores which rows: the env's current one, a module, or a hub env revision.

    choice = VerifierChoice({"arithmetic": "my_envs/arith_v2.py"})   # rows of arithmetic; others: current
    choice = VerifierChoice("my_envs/arith_v2.py")                   # the one env the rows hold
    choice = VerifierChoice(env_revision="org/arith@3f1c2e9", pin="sha256:...")  # rows of that repo's env
    spec = choice.spec("arithmetic")                                 # resolved once per env

The choice is resolved in the main process, one env at a time as rows of it arrive, into a
VerifierSpec: a small picklable recipe. Worker processes load the verifier from it and check its
sha256, so every process scores with byte-identical code, and a hub verifier's pin/trust check
runs once, before any row is scored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hubgym.errors import EnvNotFoundError, RescoreError, VerifierLoadError, Where
from hubgym.verifiers.contract import Verifier, load_verifier

VerifierArg = str | Mapping[str, str] | Sequence[str] | None
_ENV_NAME = re.compile(r"[A-Za-z0-9_\-]+")


@dataclass(frozen=True)
class VerifierSpec:
    """How to load one env's verifier in any process (and prove it is the same code)."""

    env: str
    module: str  # import name; rows record it as `rescore_verifier_module`
    path: str  # source file, imported from when `module` is not importable (a user's .py file)
    sha256: str
    origin: str  # "registry", "module" or the hub env "org/name@<commit>"

    @classmethod
    def of(cls, verifier: Verifier, env: str, origin: str) -> "VerifierSpec":
        return cls(env, verifier.name, str(verifier.source_path), verifier.sha256, origin)


@lru_cache(maxsize=128)
def load_spec(spec: VerifierSpec) -> Verifier:
    """The verifier of a spec (cached per process); refuses code whose sha256 changed since it was chosen."""
    try:
        verifier = load_verifier(spec.module, env=spec.env)
    except ModuleNotFoundError:  # a module imported from a file: its generated name exists only where it was
        verifier = load_verifier(spec.path, env=spec.env)
    if verifier.sha256 != spec.sha256:
        raise VerifierLoadError(f"verifier {spec.module} changed while re-scoring (sha256 {verifier.sha256[:12]}, "
                                f"chosen as {spec.sha256[:12]})", Where(env=spec.env, field=spec.path),
                                "do not edit a verifier while a re-score runs; run it again")
    return verifier


def parse_verifier_arg(verifier: VerifierArg) -> dict[str | None, str]:
    """`MODULE`, `ENV=MODULE` (repeatable) or {env: module} -> {env or None: module}; None = the rows' one env."""
    if verifier is None:
        return {}
    if isinstance(verifier, Mapping):
        return {str(env): str(module) for env, module in verifier.items()}
    parsed: dict[str | None, str] = {}
    for item in [verifier] if isinstance(verifier, str) else verifier:
        env, sep, module = str(item).partition("=")
        if not sep or not _ENV_NAME.fullmatch(env):
            env, module = None, str(item)
        if env in parsed:
            raise RescoreError(f"two verifiers given for {'the same env ' + repr(env) if env else 'no env'} "
                               f"({parsed[env]} and {module}); give one --verifier per env as ENV=MODULE")
        parsed[env] = module
    return parsed


class VerifierChoice:
    """The verifier for each env, resolved the first time rows of that env are seen."""

    def __init__(self, verifier: VerifierArg = None, env_revision: str | None = None, *, trust: bool = False,
                 pin: str | None = None, hub=None):
        self.modules = parse_verifier_arg(verifier)
        if self.modules and env_revision:
            raise RescoreError("give --verifier or --env-revision, not both: --env-revision already names the "
                               "verifier of its env")
        self.hub_env = hub_verifier(env_revision, trust=trust, pin=pin, hub=hub) if env_revision else None
        self.specs: dict[str, VerifierSpec] = {}

    def spec(self, env: str) -> VerifierSpec:
        if env not in self.specs:
            self.specs[env] = self._resolve(env)
        return self.specs[env]

    def unused(self) -> list[str]:
        """The verifiers asked for that scored no row (an env name that matches none of the rows, say)."""
        envs = set(self.specs)
        given = [f"--verifier {env}={module}" for env, module in self.modules.items() if env and env not in envs]
        if None in self.modules and not any(s.origin == "module" for s in self.specs.values()):
            given.append(f"--verifier {self.modules[None]}")
        if self.hub_env is not None and self.hub_env[0] not in envs:
            given.append(f"--env-revision {self.hub_env[2]} (env {self.hub_env[0]!r})")
        return given

    def _resolve(self, env: str) -> VerifierSpec:
        if env in self.modules:
            return VerifierSpec.of(_load_module(self.modules[env], env), env, "module")
        if None in self.modules:
            bound = [e for e, s in self.specs.items() if s.origin == "module" and e not in self.modules]
            if bound:
                raise RescoreError(f"--verifier {self.modules[None]} names no env, and the rollouts hold rows of "
                                   f"{bound[0]!r} and {env!r}; say which env it scores: --verifier "
                                   f"{bound[0]}={self.modules[None]} (other envs keep their current verifier)")
            return VerifierSpec.of(_load_module(self.modules[None], env), env, "module")
        if self.hub_env is not None and self.hub_env[0] == env:
            return VerifierSpec.of(self.hub_env[1], env, self.hub_env[2])
        return VerifierSpec.of(_current(env), env, "registry")


def _load_module(ref: str, env: str) -> Verifier:
    """A module name, or a .py path made absolute (worker processes may resolve paths elsewhere)."""
    return load_verifier(str(Path(ref).resolve()) if ref.endswith(".py") else ref, env=env)


def _current(env: str) -> Verifier:
    from hubgym.builders.registry import resolve_env

    try:
        return resolve_env(env).verifier()
    except EnvNotFoundError as exc:
        raise EnvNotFoundError(f"rows of env {env!r} have no verifier to re-score them with: {exc}. Give one with "
                               f"--verifier {env}=MODULE or --env-revision ORG/NAME@REVISION") from None


def hub_verifier(ref: str, *, trust: bool, pin: str | None, hub) -> tuple[str, Verifier, str]:
    """(env, verifier, "org/name@<commit>") of a hub env revision: its metadata only, no task data.

    The same steps as `load_env` up to the verifier, so the same pin/trust rules apply.
    """
    from hubgym.hub.base import get_hub, parse_ref
    from hubgym.hub.manifest import METADATA_FILES, read_manifest
    from hubgym.hub.trust import load_hub_verifier

    repo, revision = parse_ref(ref)
    meta = get_hub(hub).resolve(repo, revision, patterns=METADATA_FILES)
    pinned = f"{repo}@{meta.revision}"
    manifest = read_manifest(meta.path, pinned)
    return manifest["env"], load_hub_verifier(meta.path, manifest, pinned, trust=trust, pin=pin), pinned
