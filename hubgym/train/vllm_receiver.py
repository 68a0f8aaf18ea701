"""The vLLM worker side of in-memory weight sync: a worker extension (`worker_extension_cls`).

    LLM(..., worker_extension_cls=RECEIVER)               # VLLMEngine sets it for every engine
    llm.collective_rpc("hubgym_begin_weights")
    llm.collective_rpc("hubgym_load_file", args=(shared_memory_path,))    # one bucket, any number of times
    llm.collective_rpc("hubgym_load_weights", args=(safetensors_bytes,))  # (or: the bucket over the RPC itself)
    llm.collective_rpc("hubgym_finish_weights")

The steps are vLLM's own in-place reload (`reload_weights` with a weights iterator) cut in three, so
the weights can arrive in buckets: `begin` puts every layer into vLLM's layerwise-reload state, each
bucket goes through the model's `load_weights` (which maps Hugging Face names onto the fused qkv and
gate_up layers; a layer is finished -- repacked for the CPU kernels, copied into its old storage --
as soon as all of its weights have arrived, whichever bucket they came in), and `finish` completes
what is left and drops caches derived from the old weights.

A bucket crosses as one safetensors file in shared memory (/dev/shm: RAM, never a disk), and the RPC
carries only its path: vLLM's RPC channel moves large payloads slowly (SmolLM2's 540 MB took 6-8 s as
bytes inside RPC arguments, 1.5 s through shared memory). Where there is no /dev/shm the bucket goes
as safetensors bytes inside the RPC (bytes are a native type of vLLM's msgpack RPC; tensors in RPC
arguments are not decoded back into tensors).
This module is imported inside vLLM's worker processes: it needs only vLLM, safetensors and hubgym.files.
"""

from __future__ import annotations

import gc
import multiprocessing
import sys

RECEIVER = "hubgym.train.vllm_receiver.WeightReceiver"


def _in_engine_process() -> bool:
    return multiprocessing.current_process().name.startswith("EngineCore")


def _freeze_engine_process_heap() -> None:
    """In vLLM's engine process, where vLLM imports this module just before it loads the model: the objects alive
    now (torch's, transformers', vLLM's) are left out of the five garbage collections vLLM makes while it
    starts, 2 s of a CPU core there (hubgym.engines.offline._frozen_heap does the same where the core runs in the
    calling process). vLLM freezes the heap itself once started and unfreezes it when it shuts down."""
    if _in_engine_process():
        gc.freeze()


class _SpawnedProcessSys:
    """What `multiprocessing.spawn` sees as `sys`: the real one, except that its one `sys.exit` -- the last line of
    a spawned process, once the process's work and multiprocessing's own clean-up are done -- goes through
    `exit_now` (threads joined, exit handlers run, streams flushed, then the exit code) without the interpreter's
    teardown. A process that imported torch and vLLM spends 3 s there collecting garbage, and the process that
    closes the engine waits for it. A forked process never tears down either: multiprocessing ends it with
    os._exit right after its work."""

    def __getattr__(self, name: str) -> object:
        return getattr(sys, name)

    @staticmethod
    def exit(code: object = None) -> None:
        from hubgym.files.quick_exit import exit_now

        exit_now(code)


def _leave_engine_process_without_teardown() -> None:
    if _in_engine_process():
        import multiprocessing.spawn

        multiprocessing.spawn.sys = _SpawnedProcessSys()  # type: ignore[assignment]


_freeze_engine_process_heap()
_leave_engine_process_without_teardown()


class WeightReceiver:
    """Mixed into vLLM's worker class; `self` is the worker (model_runner, vllm_config)."""

    def hubgym_begin_weights(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())
        self.hubgym_loaded = 0

    def hubgym_load_weights(self, blob: bytes) -> int:
        """Load one bucket; returns how many tensors it held."""
        from safetensors.torch import load

        return self._hubgym_load(load(blob))

    def hubgym_load_file(self, path: str) -> int:
        """Load one bucket from a safetensors file in shared memory (the sender removes it afterwards)."""
        from safetensors.torch import load_file

        return self._hubgym_load(load_file(path))

    def _hubgym_load(self, tensors: dict) -> int:
        """One bucket through the model's own loader (HF names onto fused layers); how many tensors it held."""
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            self.model_runner.get_model().load_weights(iter(tensors.items()))
        self.hubgym_loaded += len(tensors)
        return len(tensors)

    def hubgym_finish_weights(self) -> int:
        """Finish every layer not finished yet; returns the tensors loaded since `begin`."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(runner.get_model(), self.vllm_config.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # as vLLM's reload does
            if hasattr(runner, reset):
                getattr(runner, reset)()
        return self.hubgym_loaded
