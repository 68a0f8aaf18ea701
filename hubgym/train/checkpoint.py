"""Checkpoints: DeepSpeed's state (weights, AdamW moments) + the caller's stream position + every RNG, atomically.

    save_checkpoint(policy, out / "checkpoints", step, {"offline_groups": 96}, keep=2)
    client = load_checkpoint(policy, out / "checkpoints")   # {"step": 12, "stream": {...}, ...} or None

ROOT holds:
    step-000012/            complete: DeepSpeed's files (weights -- with LoRA only the adapters --, AdamW state,
                            the lr scheduler's step), client.json, rng-rank-00000.pt (one per rank)
    latest.json             {"tag": "step-000012", "step": 12}, for people and tools
    .partial-step-000013/   a save in progress, or one a killed run left: never loaded, removed by the next save

Every rank writes into the partial folder (DeepSpeed writes the weights once and one optimizer
shard per rank); after a barrier rank 0 writes client.json and renames the folder to its final
name. A rename is atomic, so a checkpoint folder is complete or absent, and a resume takes the
highest complete step. All ranks must see ROOT (one machine, or a shared file system: the trainer
checks it before training, hubgym.train.nodes), and a resume needs the same number of processes
(DeepSpeed's optimizer shards are per rank).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hubgym.files import atomic_write_bytes, replace_dir
from hubgym.train.config import ConfigError

LATEST, CLIENT = "latest.json", "client.json"
PARTIAL = ".partial-"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(policy, root: str | Path, step: int, stream: dict[str, Any], keep: int = 2) -> Path:
    """Save after optimizer step `step` (call on every rank); keeps the newest `keep` checkpoints."""
    if keep < 1:
        raise ConfigError(f"keep={keep}: a run keeps at least 1 checkpoint (set keep_checkpoints >= 1)")
    root, tag = Path(root), f"step-{step:06d}"
    client = _client_json(step, stream, policy)
    partial = root / f"{PARTIAL}{tag}"
    if policy.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    _barrier()
    lora = getattr(policy, "lora", False)  # LoRA: the adapters and their AdamW state; the base is the model folder
    policy.engine.save_checkpoint(str(partial), tag=tag, save_latest=False,
                                  exclude_frozen_parameters=lora)  # -> partial/tag/...
    (partial / tag).mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), partial / tag / f"rng-rank-{policy.rank:05d}.pt")
    _barrier()
    if policy.rank == 0:
        atomic_write_bytes(partial / tag / CLIENT, client)
        replace_dir(partial / tag, root / tag)  # the same step saved again replaces the first save
        shutil.rmtree(partial)  # what is left: DeepSpeed's recovery scripts
        atomic_write_bytes(root / LATEST, json.dumps({"tag": tag, "step": step}).encode())
        _prune(root, keep)
    _barrier()
    return root / tag


def load_checkpoint(policy, root: str | Path) -> dict[str, Any] | None:
    """Restore weights, optimizer and RNG from the newest complete checkpoint (every rank); its client state.

    Returns None when ROOT holds no complete checkpoint (a fresh run).
    """
    path = latest_checkpoint(root)
    if path is None:
        return None
    client = json.loads((path / CLIENT).read_text())
    if client["world_size"] != policy.world_size:
        raise ConfigError(f"checkpoint {path} was written by {client['world_size']} processes and this run has "
                          f"{policy.world_size}: resume with {client['world_size']} processes, or convert it with "
                          "DeepSpeed's universal checkpoint tools")
    loaded, _ = policy.engine.load_checkpoint(str(path.parent), tag=path.name, load_optimizer_states=True,
                                              load_lr_scheduler_states=True,  # the schedule goes on where it was
                                              load_module_strict=not getattr(policy, "lora", False))
    if loaded is None:
        raise ConfigError(f"DeepSpeed could not load checkpoint {path}; move that folder away to resume from "
                          "the one before it, or remove the whole checkpoint folder to start over")
    rng = path / f"rng-rank-{policy.rank:05d}.pt"
    set_rng_state(torch.load(rng, weights_only=False))  # our own pickle: RNG states are tuples and numpy arrays
    return {**client, "path": str(path)}


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint folder under ROOT, or None."""
    done = _complete(Path(root))
    return done[-1] if done else None


def _client_json(step: int, stream: dict[str, Any], policy) -> bytes:
    record = {"step": step, "stream": stream, "world_size": policy.world_size,
              "zero_stage": policy.settings.zero_stage, "global_steps": policy.engine.global_steps}
    try:
        return json.dumps(record, indent=1).encode()
    except TypeError as exc:
        raise ConfigError(f"the stream position {stream!r} cannot be saved as JSON ({exc}); pass plain numbers, "
                          "strings, lists and dicts") from None


def _complete(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("step-*") if (p / CLIENT).is_file()) if root.is_dir() else []


def _prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; drop older ones and anything a killed save left."""
    leftovers = [p for p in root.iterdir() if p.name.startswith(PARTIAL) or p.name.endswith(".old")]
    for path in _complete(root)[:-keep] + leftovers:
        shutil.rmtree(path, ignore_errors=True)


def _barrier() -> None:
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
