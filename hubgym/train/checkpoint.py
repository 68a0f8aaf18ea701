"""Checkpoints: DeepSpeed state (weights, optimizer) + where the stream was + every RNG.

    save_checkpoint(policy, out / "checkpoints", step, {"offline_groups": 96}, keep=2)
    state = load_checkpoint(policy, out / "checkpoints")      # None when there is none

DeepSpeed writes `ROOT/step-000012/`; only after it finished is `ROOT/latest.json` replaced
(atomically) to point at it. A run killed mid-save leaves a folder nothing points to, which the
next save removes, so a resume always starts from a complete checkpoint.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hubgym.fileio import atomic_write_bytes

LATEST = "latest.json"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(policy, root: str | Path, step: int, stream: dict[str, Any], keep: int = 2) -> Path:
    root = Path(root)
    tag = f"step-{step:06d}"
    policy.engine.save_checkpoint(str(root), tag=tag, client_state={"step": step, "stream": stream,
                                                                      "rng": rng_state()}, save_latest=False)
    if policy.rank == 0:
        atomic_write_bytes(root / LATEST, json.dumps({"tag": tag, "step": step}).encode())
        _prune(root, keep)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return root / tag


def load_checkpoint(policy, root: str | Path) -> dict[str, Any] | None:
    """Restore weights, optimizer and RNG from the latest complete checkpoint; its client state, or None."""
    latest = Path(root) / LATEST
    if not latest.exists():
        return None
    tag = json.loads(latest.read_text())["tag"]
    _, client = policy.engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True)
    if client is None:
        raise RuntimeError(f"checkpoint {root}/{tag} could not be loaded; delete {latest} to start over")
    set_rng_state(client["rng"])
    return client


def _prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints; drop older ones and any half-written folder."""
    current = json.loads((root / LATEST).read_text())["tag"]
    tags = sorted(p for p in root.glob("step-*") if p.is_dir())
    done = [p for p in tags if p.name <= current]
    for path in done[:-keep] + [p for p in tags if p.name > current]:
        shutil.rmtree(path, ignore_errors=True)


def _tuples(value: Any) -> Any:
    """random.setstate wants tuples; a state that went through a serializer may hold lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
