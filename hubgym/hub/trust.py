"""Verifier code from a repo runs only when its sha256 matches a pin, or the user trusts the repo.

    load_hub_verifier(folder, manifest, ref, pin="sha256:9f2c...")   # runs it: the bytes are the pinned ones
    load_hub_verifier(folder, manifest, ref, trust=True)             # runs whatever the repo holds
    load_hub_verifier(folder, manifest, ref)                         # VerifierNotTrustedError: shows the sha256

The file is hashed before anything is imported, so a refusal never executes a line of it. A
manifest whose recorded sha256 disagrees with the file is refused even when trusted: rollouts
record the verifier's sha256 as provenance, and that record would be false.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shlex
import sys
from pathlib import Path

from hubgym.errors import EnvContractError, VerifierLoadError, VerifierNotTrustedError, Where
from hubgym.verifiers.contract import Verifier, load_verifier

_SHA256 = re.compile(r"^(?:sha256:)?([0-9a-f]{64})$")


def normalize_pin(pin: str) -> str:
    """'sha256:<64 hex>' or '<64 hex>' -> the hex digest."""
    match = _SHA256.match(pin.strip().lower())
    if match is None:
        raise VerifierNotTrustedError(f"pin {pin!r} is not a sha256; write it as sha256:<64 hex digits> "
                                      f"(the refusal message of an unpinned load shows it)", pinned=pin)
    return match.group(1)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pin_hints(ref: str, sha256: str, hub: str | None = None) -> tuple[str, str]:
    """How to load `ref` with its verifier pinned: the Python call, and the options of `hubgym rollout` and
    `hubgym score`. `hub` is the hub argument, given unless the hub is the default one (see `hub_argument`)."""
    repo = ref.partition("@")[0]
    python = f"hubgym.load_env({ref!r}, pin='sha256:{sha256}'" + (f", hub={hub!r})" if hub else ")")
    cli = f"--pin {repo}=sha256:{sha256}" + (f" --hub {shlex.quote(hub)}" if hub else "")
    return python, cli


def load_hub_verifier(folder: Path, manifest: dict, ref: str, *, trust: bool = False,
                      pin: str | None = None, hub: str | None = None) -> Verifier:
    """The repo's verifier, if it is pinned or trusted (see the module docstring); else a refusal.

    `hub` (the hub argument, None for the default hub) goes into the refusal's advice, so following it loads
    from the same hub."""
    repo, _, revision = ref.partition("@")
    spec = manifest["verifier"]
    path = folder / spec["path"]
    if not path.is_file():
        raise EnvContractError(f"repo {ref} has no {spec['path']}, which its manifest names as the verifier",
                               Where(env=ref, field=spec["path"]), "re-push the env with `hubgym push`")
    source = path.read_bytes()  # read once: these bytes are hashed, checked and, if allowed, run
    actual = hashlib.sha256(source).hexdigest()
    if actual != spec.get("sha256"):
        raise VerifierNotTrustedError(
            f"not running the verifier of {ref}: the manifest records sha256 {spec.get('sha256')} but "
            f"{spec['path']} has sha256 {actual}, so the repo was edited by hand or is corrupt. Re-push the env "
            f"with `hubgym push`", repo=repo, revision=revision, sha256=actual)
    if pin is not None:
        expected = normalize_pin(pin)
        if expected != actual:
            raise VerifierNotTrustedError(
                f"not running the verifier of {ref}: its sha256 is {actual}, but the pin is sha256:{expected}. The "
                f"verifier changed since it was pinned (or the pin is for another env): load the revision you "
                f"pinned, or read {path} and pin sha256:{actual}", repo=repo, revision=revision, sha256=actual,
                pinned=expected)
    elif not trust:
        python, cli = pin_hints(ref, actual, hub)
        raise VerifierNotTrustedError(
            f"not running the verifier of {ref}: verifier code from a hub repo runs only when its sha256 matches "
            f"a pin, or with trust. Its sha256 is {actual}. Read {path}, then pin it: {python} (CLI: {cli}), or "
            f"pass trust=True (CLI: --trust) to run it unpinned", repo=repo, revision=revision, sha256=actual)
    return _import(path, source, spec.get("module"), actual, manifest["env"], ref)


def _import(path: Path, source: bytes, module: str | None, sha256: str, env: str, ref: str) -> Verifier:
    """Import the verifier: the installed module when its source is byte-identical (it then runs in its
    own package, next to any data files it reads), else the checked bytes of the repo's file."""
    installed = _installed_source(module)
    if installed is not None and file_sha256(installed) == sha256:
        verifier = load_verifier(module, env=env)  # type: ignore[arg-type]
        if verifier.sha256 == sha256:
            return verifier
    try:
        return load_verifier(str(path), env=env, source=source)
    except VerifierLoadError:
        raise
    except Exception as exc:
        raise VerifierLoadError(f"the verifier of {ref} failed to import: {type(exc).__name__}: {exc}",
                                Where(env=env, field=path.name),
                                "a hub verifier must be one self-contained module: it may import installed "
                                "packages (hubgym, the standard library), but not files next to it") from exc


def _installed_source(module: str | None) -> Path | None:
    """The source file of an installed module, found without running any code that is not running already:
    only a module whose parent package is imported is looked up, and looking up does not import it."""
    if not module or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", module):
        return None
    if module.rpartition(".")[0] not in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return origin if origin is not None and origin.suffix == ".py" and origin.is_file() else None
