"""An env's code from a repo (its verifier, and its tools module when it ships one) runs only when the sha256 of
that code matches a pin, or the user trusts the repo.

    load_hub_verifier(folder, manifest, ref, pin="sha256:9f2c...")   # runs it: the bytes are the pinned ones
    load_hub_verifier(folder, manifest, ref, trust=True)             # runs whatever the repo holds
    load_hub_verifier(folder, manifest, ref)                         # VerifierNotTrustedError: shows the sha256

One pin covers every code file of the revision: it is `code_sha256` of their sha256s (what
`sha256sum tools.py verifier.py | sha256sum` prints, the files in path order). Every file is read
once and hashed before anything is imported, so a refusal never executes a line of it; the
bytes that were hashed are the bytes that run. A file whose bytes disagree with the sha256 the
manifest records is refused even when trusted: rollouts record the verifier's sha256 as
provenance, and that record would be false.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shlex
import sys
from pathlib import Path

from hubgym.errors import EnvContractError, VerifierLoadError, VerifierNotTrustedError, Where
from hubgym.hub.names import normalize_pin
from hubgym.verifiers.contract import Verifier, load_verifier

def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_sha256(files: dict[str, str]) -> str:
    """The env's pin: the sha256 of `sha256sum`'s listing of its code files ({repo path: sha256}), in path order."""
    listing = "".join(f"{sha}  {path}\n" for path, sha in sorted(files.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


def pin_hints(ref: str, sha256: str, hub: str | None = None) -> tuple[str, str]:
    """How to load `ref` with its code pinned: the Python call, and the options of `hubgym rollout` and
    `hubgym score`. `hub` is the hub argument, given unless the hub is the default one (see `hub_argument`)."""
    repo = ref.partition("@")[0]
    python = f"hubgym.load_env({ref!r}, pin='sha256:{sha256}'" + (f", hub={hub!r})" if hub else ")")
    cli = f"--pin {repo}=sha256:{sha256}" + (f" --hub {shlex.quote(hub)}" if hub else "")
    return python, cli


def load_hub_verifier(folder: Path, manifest: dict, ref: str, *, trust: bool = False,
                      pin: str | None = None, hub: str | None = None) -> Verifier:
    """The repo's verifier, with its tools, if its code is pinned or trusted (see the module docstring); else a
    refusal.

    `hub` (the hub argument, None for the default hub) goes into the refusal's advice, so following it loads
    from the same hub."""
    repo, _, revision = ref.partition("@")
    code = read_code(folder, manifest, ref)
    actual = code_sha256({path: hashlib.sha256(source).hexdigest() for path, source in code.items()})
    listed = ", ".join(code)
    if pin is not None:
        expected = normalize_pin(pin)
        if expected != actual:
            raise VerifierNotTrustedError(
                f"not running the code of {ref} ({listed}): its sha256 is {actual}, but the pin is sha256:{expected}. "
                f"The code changed since it was pinned (or the pin is for another env): load the revision you "
                f"pinned, or read {listed} in {folder} and pin sha256:{actual}", repo=repo, revision=revision,
                sha256=actual, pinned=expected)
    elif not trust:
        python, cli = pin_hints(ref, actual, hub)
        raise VerifierNotTrustedError(
            f"not running the code of {ref} ({listed}): env code from a hub repo runs only when its sha256 "
            f"matches a pin, or with trust. Its sha256 is {actual}. Read {listed} in {folder}, then pin it: "
            f"{python} (CLI: {cli}), or pass trust=True (CLI: --trust) to run it unpinned", repo=repo,
            revision=revision, sha256=actual)
    spec = manifest["verifier"]
    verifier = _import(folder / spec["path"], code[spec["path"]], spec.get("module"), spec["sha256"],
                       manifest["env"], ref)
    tools = manifest.get("tools_module")
    if tools:
        verifier.tools = _import_tools(folder / tools["path"], code[tools["path"]], manifest["env"], ref)
    verifier.code_sha256 = actual
    return verifier


def read_code(folder: Path, manifest: dict, ref: str) -> dict[str, bytes]:
    """{repo path: bytes} of every code file the manifest names, each read once and checked against the sha256
    recorded for it (a mismatch is refused whatever the trust: the repo was edited by hand, or is corrupt)."""
    repo, _, revision = ref.partition("@")
    specs = [manifest["verifier"]] + ([manifest["tools_module"]] if manifest.get("tools_module") else [])
    code: dict[str, bytes] = {}
    for spec in specs:
        path = folder / spec["path"]
        if not path.is_file():
            raise EnvContractError(f"repo {ref} has no {spec['path']}, which its manifest names as code of the env",
                                   Where(env=ref, field=spec["path"]), "re-push the env with `hubgym push`")
        source = path.read_bytes()  # read once: these bytes are hashed, checked and, if allowed, run
        actual = hashlib.sha256(source).hexdigest()
        if actual != spec.get("sha256"):
            raise VerifierNotTrustedError(
                f"not running the code of {ref}: the manifest records sha256 {spec.get('sha256')} for "
                f"{spec['path']}, but the file has sha256 {actual}, so the repo was edited by hand or is corrupt. "
                f"Re-push the env with `hubgym push`", repo=repo, revision=revision, sha256=actual)
        code[spec["path"]] = source
    recorded = (manifest.get("code") or {}).get("sha256")
    listing = code_sha256({path: hashlib.sha256(source).hexdigest() for path, source in code.items()})
    if recorded is not None and recorded != listing:
        raise VerifierNotTrustedError(f"not running the code of {ref}: the manifest's code.sha256 {recorded} is not "
                                      f"the sha256 of its code files ({listing}); re-push the env with `hubgym push`",
                                      repo=repo, revision=revision, sha256=listing)
    return code


def _import_tools(path: Path, source: bytes, env: str, ref: str):
    """The env's tools module, from the checked bytes."""
    from hubgym.tools.modules import load_tools

    try:
        return load_tools(str(path), env=env, source=source)
    except Exception as exc:
        raise VerifierLoadError(f"the tools module of {ref} failed to import: {type(exc).__name__}: {exc}",
                                Where(env=env, field=path.name),
                                "a hub tools module must be one self-contained module: it may import installed "
                                "packages (hubgym, the standard library), but not files next to it") from exc


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
