"""Hub: push and pull environments (Hugging Face Hub, or a local hub folder).

    from hubgym.hub import get_hub, load_env, push_env

    result = push_env("arithmetic", "org/arith", configs=["easy"])        # one commit, a new revision
    env = load_env(result.ref, pin="sha256:" + result.manifest["verifier"]["sha256"])
    env.tasks["test"][0], env.verifier.score(...)

The hub is `get_hub()`: $HUBGYM_HUB ("hf" for the Hugging Face Hub at HF_ENDPOINT, an http(s)
URL for a server speaking its API, or a folder), else the local hub folder ~/.cache/hubgym/hub.
"""

from hubgym.hub.base import HubBackend, Revision, Snapshot, get_hub, parse_ref
from hubgym.hub.hf import HfHub
from hubgym.hub.load import HubEnv, load_env
from hubgym.hub.local import LocalHub
from hubgym.hub.manifest import MANIFEST_FILE, VERIFIER_FILE, read_manifest
from hubgym.hub.push import PushResult, push_env
from hubgym.hub.rollouts import RolloutPush, iter_batches, iter_rollouts, open_rollouts, push_rollouts
from hubgym.hub.trust import normalize_pin


__all__ = [
    "MANIFEST_FILE", "VERIFIER_FILE", "HfHub", "HubBackend", "HubEnv", "LocalHub", "PushResult", "Revision",
    "RolloutPush", "Snapshot", "get_hub", "iter_batches", "iter_rollouts", "load_env", "normalize_pin", "open_rollouts",
    "parse_ref", "push_env", "push_rollouts", "read_manifest",
]
