"""Which verifier re-scores which rows: the env's current one, a module, or a hub env revision.

    choice = VerifierChoice({"arithmetic": "my_envs/arith_v2.py"})   # rows of arithmetic; others: current
    choice = VerifierChoice("my_envs/arith_v2.py")                   # the one env the rows hold
    choice = VerifierChoice(env_revision="org/arith@3f1c2e9", pin="sha256:...")  # rows of that repo's env
    choice = VerifierChoice({"guess": "g2.py"}, ["org/arith@3f1c2e9"], pin=["org/arith=sha256:..."])  # one per env
    spec = choice.spec("arithmetic")                                 # resolved once per env

The choice is resolved in the main process, one env at a time as rows of it arrive, into a
VerifierSpec: a small picklable recipe. Worker processes load the verifier from it and check its
sha256, so every process scores with byte-identical code, and a hub verifier's pin/trust check
runs once, before any row is scored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hubgym.errors import RescoreError, VerifierLoadError, Where
from hubgym.envs.open import open_env
from hubgym.envs.pins import PinArg, parse_pins
from hubgym.envs.refs import ENV_NAME
from hubgym.envs.stored import stored_env_verifier
from hubgym.verifiers.contract import Verifier, load_verifier

VerifierArg = str | Mapping[str, str] | Sequence[str] | None


@dataclass(frozen=True)
class VerifierSpec:
    """How to load one env's verifier in any process (and prove it is the same code)."""

    env: str
    module: str  # import name; rows record it as `rescore_verifier_module`
    path: str  # source file, imported from when `module` is not importable (a user's .py file)
    sha256: str
    origin: str  # "registry", "module" or the hub env "org/name@<commit>"
    tools_path: str = ""  # the env's own tools module (a file), loaded beside the verifier; "" when it has none
    tools_sha256: str = ""

    @classmethod
    def of(cls, verifier: Verifier, env: str, origin: str) -> "VerifierSpec":
        tools = verifier.tools
        return cls(env, verifier.name, str(verifier.source_path), verifier.sha256, origin,
                   str(tools.path) if tools else "", tools.sha256 if tools else "")


@lru_cache(maxsize=128)
def load_verifier_of(spec: VerifierSpec) -> Verifier:
    """The verifier of a spec (cached per process); refuses code whose sha256 changed since it was chosen."""
    try:
        verifier = load_verifier(spec.module, env=spec.env)
    except (ModuleNotFoundError, VerifierLoadError):  # a module imported from a file: its generated name exists
        # only where it was imported (load_verifier says so with either error)
        verifier = load_verifier(spec.path, env=spec.env)
    if verifier.sha256 != spec.sha256:
        raise VerifierLoadError(f"verifier {spec.module} changed while re-scoring (sha256 {verifier.sha256[:12]}, "
                                f"chosen as {spec.sha256[:12]})", Where(env=spec.env, field=spec.path),
                                "do not edit a verifier while a re-score runs; run it again")
    if spec.tools_path:
        from hubgym.tools.modules import load_tools

        verifier.tools = load_tools(spec.tools_path, env=spec.env)
        if verifier.tools.sha256 != spec.tools_sha256:
            raise VerifierLoadError(f"the tools module {spec.tools_path} changed while re-scoring",
                                    Where(env=spec.env, field=spec.tools_path), "run it again")
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
        if not sep or not ENV_NAME.fullmatch(env):
            env, module = None, str(item)
        if env in parsed:
            raise RescoreError(f"two verifiers given for {'the same env ' + repr(env) if env else 'no env'} "
                               f"({parsed[env]} and {module}); give one --verifier per env as ENV=MODULE")
        parsed[env] = module
    return parsed


RevisionArg = str | Sequence[str] | None


class VerifierChoice:
    """The verifier for each env, chosen by the user and resolved the first time rows of that env are seen.

    Each env has one source: a module given for it (`ENV=MODULE`), the verifier of a hub env revision of that
    env (pinned or trusted), a module given without an env (the one env no other source covers), or else the
    env's current registered verifier. A row's env value itself never names code (see hubgym.envs.stored).
    """

    def __init__(self, verifier: VerifierArg = None, env_revision: RevisionArg = None, *, trust: bool = False,
                 pin: PinArg = None, hub=None):
        self.modules = parse_verifier_arg(verifier)
        revisions = [env_revision] if isinstance(env_revision, str) else list(env_revision or [])
        pins = parse_pins(pin, revisions)
        self.hub_envs: dict[str, tuple[Verifier, str, str]] = {}  # env -> (verifier, org/name@<commit>, as given)
        for ref in revisions:
            opened = open_env(ref, hub=hub, trust=trust, pins=pins)  # its manifest and code only: no task data
            env, loaded, pinned = opened.env, opened.verifier, opened.pinned_ref
            if env in self.hub_envs or env in self.modules:
                other = self.hub_envs[env][2] if env in self.hub_envs else f"--verifier {env}={self.modules[env]}"
                raise RescoreError(f"two verifiers given for env {env!r}: --env-revision {ref} and {other}; give one "
                                   f"source per env")
            self.hub_envs[env] = (loaded, pinned, ref)
        self.specs: dict[str, VerifierSpec] = {}

    def spec(self, env: str) -> VerifierSpec:
        if env not in self.specs:
            self.specs[env] = self._resolve(env)
        return self.specs[env]

    def unused(self) -> list[str]:
        """The verifiers asked for that scored no row (an env name that matches none of the rows, say)."""
        envs = set(self.specs)
        given = [f"--verifier {env}={module}" for env, module in self.modules.items() if env and env not in envs]
        if None in self.modules and not any(s.origin == "module" and s.env not in self.modules
                                            for s in self.specs.values()):
            given.append(f"--verifier {self.modules[None]}")
        given += [f"--env-revision {ref} (env {env!r})"
                  for env, (_, _, ref) in self.hub_envs.items() if env not in envs]
        return given

    def _resolve(self, env: str) -> VerifierSpec:
        if env in self.modules:
            return VerifierSpec.of(_load_module(self.modules[env], env), env, "module")
        if env in self.hub_envs:
            verifier, pinned, _ = self.hub_envs[env]
            return VerifierSpec.of(verifier, env, pinned)
        if None in self.modules:
            bound = [e for e, s in self.specs.items() if s.origin == "module" and e not in self.modules]
            if bound:
                raise RescoreError(f"--verifier {self.modules[None]} names no env, and the rollouts hold rows of "
                                   f"{bound[0]!r} and {env!r}; say which env it scores: --verifier "
                                   f"{bound[0]}={self.modules[None]} (other envs keep their current verifier)")
            return VerifierSpec.of(_load_module(self.modules[None], env), env, "module")
        return VerifierSpec.of(stored_env_verifier(env), env, "registry")


def _load_module(ref: str, env: str) -> Verifier:
    """A module name, or a .py path made absolute (worker processes may resolve paths elsewhere); links are kept,
    so a path that links to a file without the .py name still imports."""
    return load_verifier(str(Path(ref).absolute()) if ref.endswith(".py") else ref, env=env)
