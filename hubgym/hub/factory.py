"""Which hub a spec names: the one factory of hub backends (`get_hub`), and how to name a hub again.

    get_hub()                      # $HUBGYM_HUB, else the local hub folder ~/.cache/hubgym/hub
    get_hub("hf")                  # the Hugging Face Hub at HF_ENDPOINT
    get_hub("https://hub.example") # any server speaking the Hub API
    hub_argument(hub)              # what --hub must say to reach it (None: the default hub)
"""

from __future__ import annotations

import os
from pathlib import Path

from hubgym.hub.base import DEFAULT_LOCAL_HUB, HUB_ENV_VAR, HubBackend
from hubgym.hub.hf import HfHub
from hubgym.hub.local import LocalHub


def get_hub(spec: HubBackend | str | os.PathLike | None = None) -> HubBackend:
    """The hub named by `spec`, else by $HUBGYM_HUB, else the local hub folder ~/.cache/hubgym/hub.

    "hf" (or "huggingface") is the Hugging Face Hub at HF_ENDPOINT; an http(s) URL is a Hub-API
    server at that URL; anything else is a local hub folder.
    """
    if isinstance(spec, HubBackend):
        return spec
    spec = os.fspath(spec) if spec is not None else os.environ.get(HUB_ENV_VAR) or str(DEFAULT_LOCAL_HUB)
    if spec in ("hf", "hf:", "huggingface"):
        return HfHub()
    if spec.startswith(("http://", "https://")):
        return HfHub(endpoint=spec)
    return LocalHub(Path(spec.removeprefix("file://")).expanduser())


def hub_argument(hub: HubBackend) -> str | None:
    """What `hub=` / `--hub` must say to reach this hub again; None when it is the default hub (`get_hub()`)."""
    spec = hub.spec()
    return None if spec == get_hub().spec() else spec
