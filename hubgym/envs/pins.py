"""The one parser of pins: which code a hub env revision must hold before any of it runs.

    parse_pins(["org/arith=sha256:9f2c..."])                 # {"org/arith": "sha256:9f2c..."}
    parse_pins("sha256:9f2c...", revisions=["org/arith@3f1c2e9"])   # a bare pin names the one revision given
    parse_pins({"org/arith@3f1c2e9": "9f2c..."})             # a mapping (Python callers, YAML configs)

A pin is the sha256 of the env's code (every code file of the revision: the verifier and its tools; see
hubgym.hub.trust.code_sha256), written `sha256:<64 hex>`. Pins are checked here, when the command is read,
so a typo is one line before anything loads. Keys are repos (`org/name`); a revision written after `@` is
dropped, since the pin itself says which code is meant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hubgym.errors import VerifierNotTrustedError
from hubgym.hub.names import check_repo_id, normalize_pin, shown

PinArg = str | Mapping[str, str] | Sequence[str] | None
PIN_HELP = "REPO=sha256:<hex>: the code a hub env must hold (repeatable); its refusal prints the sha256"


def parse_pins(pin: PinArg, revisions: Sequence[str] = ()) -> dict[str, str]:
    """`REPO=sha256:<hex>` items (or one string), or {repo: pin} -> {repo: "sha256:<hex>"}. A bare `sha256:<hex>`
    pins the one revision in `revisions`; anything else is one VerifierNotTrustedError saying how to write it."""
    if pin is None:
        return {}
    items = list(pin.items()) if isinstance(pin, Mapping) else [_split(str(p), revisions) for p in
                                                                 ([pin] if isinstance(pin, str) else pin)]
    pins: dict[str, str] = {}
    for repo, value in items:
        repo = str(repo).partition("@")[0]
        try:
            check_repo_id(repo)
        except Exception:  # noqa: BLE001 - the repo rule's message, said as a pin problem
            raise VerifierNotTrustedError(f"--pin {shown(f'{repo}={value}')}: {shown(repo)} is not a hub repo "
                                          f"(org/name); {_HOW}", pinned=str(value)) from None
        digest = normalize_pin(str(value))
        if pins.get(repo, digest) != digest:
            raise VerifierNotTrustedError(f"two different pins for {repo}; give one --pin per repo", pinned=digest)
        pins[repo] = f"sha256:{digest}"
    return pins


_HOW = "write --pin REPO=sha256:<64 hex digits>, e.g. --pin org/arith=sha256:9f2c... (an unpinned load prints it)"


def _split(item: str, revisions: Sequence[str]) -> tuple[str, str]:
    repo, sep, value = item.partition("=")
    if sep:
        return repo, value
    if len(revisions) != 1:
        raise VerifierNotTrustedError(f"--pin {shown(item)} names no repo, and {len(revisions)} hub env revisions "
                                      f"are given; {_HOW}", pinned=item)
    return revisions[0], item
