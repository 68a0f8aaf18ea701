"""Put the trainer's weights into the running vLLM engine, without restarting it.

vLLM runs its model in an engine-core process. `WeightSyncExtension` is mixed into vLLM's worker
(`worker_extension_cls`), so `LLM.collective_rpc("hubgym_load_weights", ...)` runs in that
process: it reads a safetensors file the trainer wrote and hands the tensors to the model's own
`reload_weights`, which maps Hugging Face names onto vLLM's fused layers (qkv, gate_up) and
redoes the kernel-specific repacking. The prefix
cache is reset after a sync, so no KV computed by the old weights is reused.

    engine = VLLMEngine(model_dir, **SYNC_ENGINE_ARGS)
    sync_weights(engine, policy.full_state_dict(), version=3, scratch=out / "sync")

A file is the channel because it works for every executor and process layout on CPU and GPU;
for the models this runs here it costs milliseconds. (A GPU cluster would use NCCL broadcast.)
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

SYNC_ENGINE_ARGS = {"worker_extension_cls": "hubgym.train.sync.WeightSyncExtension"}


class WeightSyncExtension:
    """Methods added to vLLM's worker (runs inside the engine process)."""

    def hubgym_load_weights(self, path: str) -> int:
        from safetensors.torch import load_file

        weights = load_file(path)
        # In-place reload: loads checkpoint-format tensors and redoes vLLM's post-load processing
        # (on CPU the linear weights are repacked for oneDNN, so a bare load_weights cannot be used).
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))  # type: ignore[attr-defined]
        return len(weights)


def sync_weights(engine, state_dict: dict[str, torch.Tensor], version: int, scratch: str | Path) -> float:
    """Load `state_dict` (HF names) into `engine`'s model; returns the seconds it took."""
    from safetensors.torch import save_file

    started = time.perf_counter()
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "weights.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file({k: v.detach().to(torch.float32).clone() for k, v in state_dict.items()}, str(tmp))  # clone: tied weights
    tmp.replace(path)
    counts = engine.llm.collective_rpc("hubgym_load_weights", args=(str(path),))
    if not counts or min(counts) == 0:
        raise RuntimeError(f"vLLM loaded no weights from {path}")
    engine.llm.reset_prefix_cache()
    engine.policy_version = version
    return time.perf_counter() - started
