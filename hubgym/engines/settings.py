"""How the vLLM engine is started, checked in one place: `EngineSettings`.

    settings = EngineSettings(dtype="bfloat16", gpu_memory_utilization=0.3)
    settings.check(setting="--")     # one line naming the option, before vLLM starts
    settings.vllm_args()             # the engine arguments for this machine

`hubgym rollout`, `hubgym eval`, the Ray workers and the trainer all take these, so a setting means the same
everywhere and a value vLLM would refuse deep in its start-up (or, for a GPU count, hang on) is one line.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from hubgym.errors import EngineError

EAGER_ENV = "HUBGYM_ENFORCE_EAGER"  # "1": every engine hubgym starts on this machine skips torch.compile
KINDS = ("vllm", "openai")  # vllm: the offline engine in this process; openai: an OpenAI-compatible server
DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(frozen=True)
class EngineSettings:
    """The vLLM engine's own settings (the model, context and seed are the run's).

    dtype "auto" is vLLM's choice on a GPU (bfloat16 for an fp32 checkpoint) but float32 on a CPU: vLLM's CPU
    backend would pick bfloat16 too, and rollouts there have always been sampled in the checkpoint's float32.
    gpu_memory_utilization None is vLLM's 0.9 (alone on a GPU); beside a trainer give it a share, e.g. 0.3.
    enforce_eager skips torch.compile: an engine starts 10-15 s sooner on a CPU and decodes slower, a trade that
    pays for short runs; HUBGYM_ENFORCE_EAGER=1 asks it of every engine started with that variable set."""

    dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    enable_sleep_mode: bool = False
    enforce_eager: bool = False

    def is_default(self) -> bool:
        return self == EngineSettings()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check_for(self, kind: str, setting: str = "vllm.") -> None:
        """Refuse settings an engine of `kind` cannot use: any at all for a server (it has its own), a value this
        machine's vLLM cannot take for the offline engine. The one place both rules live."""
        if self.is_default():
            return
        if kind == "openai":
            raise EngineError(f"{setting}* settings start a local vLLM engine; with engine openai the server has its "
                              f"own: give them to `vllm serve` (--dtype, --gpu-memory-utilization, "
                              f"--tensor-parallel-size)")
        self.check(setting)

    def check(self, setting: str = "vllm.") -> None:
        """Refuse a value vLLM cannot use here, naming the setting (`setting` prefixes the names: "vllm." in a
        train config, "--" on the command line). Imports vLLM's platform module (not its engine)."""
        self.vllm_args(setting)

    def vllm_args(self, setting: str = "vllm.") -> dict[str, Any]:
        """The checked settings as vLLM engine arguments for this machine."""
        from vllm.platforms import current_platform

        def name(key: str) -> str:
            return setting + (key.replace("_", "-") if setting == "--" else key)

        if self.dtype not in DTYPES:
            raise EngineError(f"{name('dtype')}={self.dtype!r} is not a vLLM dtype; use one of {', '.join(DTYPES)}")
        share = self.gpu_memory_utilization
        if share is not None and not 0 < share <= 1:
            raise EngineError(f"{name('gpu_memory_utilization')}={share} must be in (0, 1], the share of the GPU's "
                              f"memory vLLM takes; e.g. 0.3 beside a trainer, 0.9 alone")
        gpus, size = _visible_gpus(current_platform), self.tensor_parallel_size
        if size < 1 or size > max(gpus, 1):
            where = f"{gpus} visible GPU(s)" if gpus else "no GPU (vLLM runs on the CPU here)"
            raise EngineError(f"{name('tensor_parallel_size')}={size} needs that many GPUs, but this machine has "
                              f"{where}; set it to {max(gpus, 1)} or less (CUDA_VISIBLE_DEVICES limits them)")
        if self.enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise EngineError(f"{name('enable_sleep_mode')}: vLLM's {current_platform.device_name} backend has no "
                              f"sleep mode (CUDA and ROCm GPUs do); leave it off here")
        on_cpu_auto = self.dtype == "auto" and current_platform.is_cpu()
        args: dict[str, Any] = {"dtype": "float32" if on_cpu_auto else self.dtype, "tensor_parallel_size": size}
        if size > 1:  # vLLM's own processes, also inside a Ray worker (where vLLM would otherwise use Ray)
            args["distributed_executor_backend"] = "mp"
        if share is not None:
            args["gpu_memory_utilization"] = share
        if self.enable_sleep_mode:
            args["enable_sleep_mode"] = True
        if self.enforce_eager or os.environ.get(EAGER_ENV) == "1":
            args["enforce_eager"] = True
        return args


def compile_cache_env() -> dict[str, str]:
    """On a CPU, vLLM's classic torch.compile cache (VLLM_USE_AOT_COMPILE=0), unless the user chose either.

    With torch 2.10 and later, vLLM saves a compiled model as one "AOT" artifact and loads it at the next start;
    on its CPU backend that load always fails ("'function' object has no attribute 'finalize_loading'", logged
    as a warning), so every start tried it, compiled the model again and saved it again. The classic cache loads.
    For the environment of the process that starts the engine (vLLM reads it when the model compiles)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and "VLLM_USE_AOT_COMPILE" not in os.environ:
        return {"VLLM_USE_AOT_COMPILE": "0"}
    return {}


def _visible_gpus(platform: Any) -> int:
    """GPUs vLLM could use here: 0 on its CPU backend."""
    if platform.is_cpu():
        return 0
    import torch

    return torch.accelerator.device_count() if hasattr(torch, "accelerator") else torch.cuda.device_count()
