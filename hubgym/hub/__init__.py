"""Hub: repos of files with immutable revisions (the Hugging Face Hub, or a local hub folder), env manifests and
cards, the trust check of an env's code, and rollout repos (push, read back).

    from hubgym.hub import get_hub, push_rollouts, open_rollouts
    hub = get_hub()                                     # $HUBGYM_HUB, else ~/.cache/hubgym/hub
    push_rollouts("runs/r1", "org/arith-rollouts")      # a run's shards, as one commit

Envs are pushed and opened by the env layer (`hubgym.push_env`, `hubgym.load_env`: hubgym.envs), which
uses these. The hub is `get_hub()`: $HUBGYM_HUB ("hf" for the Hugging Face Hub at HF_ENDPOINT, an http(s)
URL for a server speaking its API, or a folder), else the local hub folder ~/.cache/hubgym/hub.

Names load on first use: importing one module of the package (its name rules, say) imports no other.
"""

from __future__ import annotations

from hubgym.files.lazy import lazy_attributes

_EXPORTS: dict[str, str] = {
    "HubBackend": "hubgym.hub.base", "Revision": "hubgym.hub.base", "Snapshot": "hubgym.hub.base",
    "get_hub": "hubgym.hub.factory", "hub_argument": "hubgym.hub.factory", "parse_ref": "hubgym.hub.base",
    "HfHub": "hubgym.hub.hf", "LocalHub": "hubgym.hub.local",
    "MANIFEST_FILE": "hubgym.hub.manifest", "TOOLS_FILE": "hubgym.hub.manifest", "VERIFIER_FILE": "hubgym.hub.manifest",
    "read_manifest": "hubgym.hub.manifest",
    "RolloutPush": "hubgym.hub.rollouts", "iter_batches": "hubgym.hub.rollouts", "iter_rollouts": "hubgym.hub.rollouts",
    "open_rollouts": "hubgym.hub.rollouts", "push_rollouts": "hubgym.hub.rollouts",
    "code_sha256": "hubgym.hub.trust", "normalize_pin": "hubgym.hub.names",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS, submodules=("local", "hf", "base", "manifest", "rollouts", "trust",
                                                                "names", "card", "shards"))
