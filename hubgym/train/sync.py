"""Put the trainer's weights into the running vLLM engine, and bring the engine back if it died.

    seconds = sync_weights(engine, policy.full_state_dict(engine_dtype(engine)), policy_version=step,
                           scratch=out / "sync")
    ...
    if ensure_engine(engine):  # its engine-core process had died: restarted, serving the same weights again
        ...

Two channels, the same result (the same names reach the same loader):

- in memory (the default, for engines started with hubgym's worker extension, hubgym.train.vllm_receiver):
  the weights, in the engine's dtype, go to vLLM's workers in buckets of about BUCKET_BYTES, each one
  safetensors file in shared memory (RAM; removed once loaded) named in an `LLM.collective_rpc` call
  (bytes inside the RPC where there is no /dev/shm: much slower), and the worker's `model.load_weights`
  takes them (vLLM maps the Hugging Face names onto its fused qkv/gate_up layers and repacks each layer
  for its kernels once all of its weights arrived). Nothing goes to disk: the last weights stay in memory,
  and are written to `scratch` only when a restart needs them (`ensure_engine`, `restart_engine`).
  Lazily, not every K syncs, because a restarted engine must serve exactly the version it is labelled
  with, and the last synced weights are all that gives it; holding them costs one copy in the engine's
  dtype, which the caller built anyway.
- a file: one safetensors file in `scratch`, reloaded by vLLM in place (`VLLMEngine.load_weights`). The
  fallback: for engines without the extension, and when an in-memory load fails half way.

Either way the prefix cache is dropped and vLLM labels what it samples from then on with the new version.
Weights are checked against the model's checkpoint (names, shapes) before the engine sees them: a wrong
name would fail inside vLLM's reload half way, leaving a model that serves neither version.
Measured syncs (seconds per step, both channels): bench/bench_sync.py.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hubgym.errors import EngineError, WeightSyncError
from hubgym.train.vllm_receiver import RECEIVER

if TYPE_CHECKING:
    from hubgym.engines import VLLMEngine

log = logging.getLogger("hubgym.train")

WEIGHTS_FILE = "model.safetensors"
BUCKET_BYTES = 256 << 20  # one RPC's worth of weights: large enough to amortize a call, small next to a model
_SCRATCH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> TemporaryDirectory (no scratch given)
_UNWRITTEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> (tensors, folder) synced in memory

NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


def sync_weights(engine: VLLMEngine, named_tensors: NamedTensors, policy_version: int,
                 scratch: str | Path | None = None, *, in_memory: bool = True) -> float:
    """Serve `named_tensors` (Hugging Face parameter names, e.g. a model's `state_dict()`) from `engine` as
    `policy_version`; returns the seconds it took. `scratch` is a folder of its own for the weights file (default:
    a temporary folder that lives as long as the engine). `in_memory=False` forces the file channel.

    In memory, the tensors are kept (not copied) until the next sync, for a restart to write: pass tensors
    nothing changes in place afterwards (`Policy.full_state_dict` gives fresh copies; a live model's
    `state_dict()` does not)."""
    started = time.perf_counter()
    model_dir = resolve_model_dir(engine.model)
    tensors = prepare_weights(named_tensors, checkpoint_layout(model_dir), tied_embeddings(model_dir),
                              model=engine.model)
    folder = _scratch_folder(engine, scratch)
    if in_memory and has_receiver(engine):
        try:
            return _sync_in_memory(engine, tensors, policy_version, folder, started)
        except EngineError:
            raise
        except Exception as exc:  # the model may hold part of the new weights: reload all of them from a file
            log.warning("in-memory weight sync failed (%s: %s); loading weights v%d from a file instead",
                        type(exc).__name__, exc, policy_version)
    _UNWRITTEN.pop(engine, None)
    size = write_weights(tensors, folder)
    written = time.perf_counter()
    engine.load_weights(str(folder), policy_version)
    seconds = time.perf_counter() - started
    log.info("weights v%d synced into vLLM in %.3fs (write %.3fs, load %.3fs; %d tensors, %.1f MB)", policy_version,
             seconds, written - started, seconds - (written - started), len(tensors), size / 2**20)
    return seconds


def has_receiver(engine: VLLMEngine) -> bool:
    """Whether the engine's workers run hubgym's worker extension (the in-memory channel)."""
    return getattr(engine, "llm_args", {}).get("worker_extension_cls") == RECEIVER


def engine_dtype(engine: VLLMEngine):
    """The dtype the engine's model computes in: the in-memory channel sends weights in it."""
    llm = getattr(engine, "llm", None)
    return llm.llm_engine.model_config.dtype if llm is not None else torch.float32


def _sync_in_memory(engine: VLLMEngine, tensors: dict[str, torch.Tensor], version: int, folder: Path,
                    started: float) -> float:
    dtype = engine_dtype(engine)
    tensors = {name: t.to(dtype) for name, t in tensors.items()}
    size = send_weights(engine, tensors, version)
    _UNWRITTEN[engine] = (tensors, folder)  # on disk only when a restart needs them
    (folder / WEIGHTS_FILE).unlink(missing_ok=True)  # older weights: a restart must never serve them as these
    engine.weights_path = str(folder)
    seconds = time.perf_counter() - started
    log.info("weights v%d synced into vLLM in memory in %.3fs (%d tensors, %.1f MB, %s)", version, seconds,
             len(tensors), size / 2**20, str(dtype).removeprefix("torch."))
    return seconds


def send_weights(engine: VLLMEngine, tensors: dict[str, torch.Tensor], version: int,
                 bucket_bytes: int = BUCKET_BYTES) -> int:
    """Load `tensors` into the engine's workers in buckets, then drop the prefix cache and set the weight version
    (as `VLLMEngine.load_weights` does); returns the bytes sent. Nothing may be generating meanwhile."""
    from safetensors.torch import save, save_file

    if not engine.alive():
        raise EngineError("the vLLM engine is not running (its engine-core process died): restart it first")
    rpc, timeout = engine.llm.collective_rpc, engine.RPC_TIMEOUT_S
    shared = shared_memory_dir()
    rpc("hubgym_begin_weights", timeout=timeout)
    sent = 0
    for bucket in buckets(tensors, bucket_bytes):
        if shared is None:
            blob = save(bucket)
            rpc("hubgym_load_weights", timeout=timeout, args=(blob,))
            sent += len(blob)
            continue
        path = shared / f"hubgym-weights-{os.getpid()}-{uuid.uuid4().hex}.safetensors"
        try:
            save_file(bucket, str(path))
            sent += path.stat().st_size
            rpc("hubgym_load_file", timeout=timeout, args=(str(path),))
        finally:
            path.unlink(missing_ok=True)
    loaded = rpc("hubgym_finish_weights", timeout=timeout)[0]
    if loaded != len(tensors):
        raise WeightSyncError(f"vLLM's workers loaded {loaded} of {len(tensors)} tensors")
    if not engine.llm.reset_prefix_cache():
        raise EngineError("vLLM could not drop its prefix cache after loading weights: requests were running; "
                          "load weights between generate calls")
    engine.llm.llm_engine.set_weight_version(str(version))
    engine.policy_version = version
    return sent


def shared_memory_dir() -> Path | None:
    """The RAM-backed folder buckets cross in (Linux's /dev/shm), or None where there is none."""
    folder = Path("/dev/shm")
    return folder if folder.is_dir() and os.access(folder, os.W_OK) else None


def buckets(tensors: dict[str, torch.Tensor], bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """Consecutive groups of about `bucket_bytes` (a larger tensor goes alone), in the given order."""
    bucket, size = {}, 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket[name], size = tensor, size + nbytes
    if bucket:
        yield bucket


def write_unwritten(engine: VLLMEngine) -> None:
    """Put the weights last synced in memory on disk, where `VLLMEngine.restart` loads them from."""
    pending = _UNWRITTEN.pop(engine, None)
    if pending is not None:
        tensors, folder = pending
        write_weights(tensors, folder)
        engine.weights_path = str(folder)


def restart_engine(engine: VLLMEngine) -> None:
    """A fresh engine serving the last synced weights and version (written to disk first if they were not)."""
    write_unwritten(engine)
    engine.restart()


def ensure_engine(engine: VLLMEngine) -> bool:
    """Restart `engine` if its engine-core process died; it then serves the last synced weights and version
    again. Returns whether it restarted. (A generate that was running when the process died raised EngineError.)"""
    if engine.alive():
        return False
    log.warning("vLLM engine for %s died; restarting it with weights v%d", engine.model, engine.policy_version)
    started = time.perf_counter()
    restart_engine(engine)
    log.info("vLLM engine restarted in %.1fs, serving weights v%d", time.perf_counter() - started,
             engine.policy_version)
    return True


def prepare_weights(named_tensors: NamedTensors, layout: dict[str, tuple[int, ...]] | None, tied: bool, *,
                    model: str = "the model") -> dict[str, torch.Tensor]:
    """CPU tensors, one storage each (safetensors refuses shared storage, e.g. a tied head), checked against
    the checkpoint `layout` (name -> shape; None: not checked). A tied model gets `lm_head.weight` from the
    embedding when it is missing: vLLM's in-place reload of a tied model puts its old head back otherwise."""
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    tensors, storages = {}, set()
    for name, tensor in items:
        tensor = tensor.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if storage in storages else tensor
        storages.add(storage)
    embed = _embedding_name(tensors)
    if tied and "lm_head.weight" not in tensors and embed is not None:
        tensors["lm_head.weight"] = tensors[embed].clone()
    if layout is not None:
        _check_layout(tensors, layout, tied, model)
    return tensors


def _check_layout(tensors: dict[str, torch.Tensor], layout: dict[str, tuple[int, ...]], tied: bool,
                  model: str) -> None:
    expected, embed = dict(layout), _embedding_name(layout)
    if tied and embed is not None:  # checkpoints of tied models usually leave the head out; state dicts have it
        expected.setdefault("lm_head.weight", layout[embed])
    unknown = sorted(set(tensors) - set(expected))
    missing = sorted(n for n in expected if n not in tensors and not n.endswith("rotary_emb.inv_freq"))
    shapes = sorted(f"{n}: {tuple(tensors[n].shape)} (model: {expected[n]})" for n in tensors
                    if n in expected and tuple(tensors[n].shape) != tuple(expected[n]))
    problems = [f"{what} {items[:5]}{' ...' if len(items) > 5 else ''}" for what, items in
                (("unknown names", unknown), ("missing names", missing), ("other shapes", shapes)) if items]
    if problems:
        raise WeightSyncError(f"weights for vLLM model {model!r} do not fit its checkpoint: {'; '.join(problems)}. "
                              f"Fix: pass the policy's full state dict with Hugging Face parameter names (the "
                              f"`state_dict()` of its AutoModelForCausalLM, without wrapper prefixes such as "
                              f"'module.'); the engine still serves the previous weights")


def _embedding_name(names: Iterable[str]) -> str | None:
    return next((n for n in names if n.endswith("embed_tokens.weight")), None)


def write_weights(tensors: dict[str, torch.Tensor], folder: Path) -> int:
    """Write `folder/model.safetensors` atomically (a restart may read it at any time); returns its size in bytes."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    foreign = [p.name for p in folder.glob("*.safetensors") if p.name != WEIGHTS_FILE]
    if foreign:  # vLLM's loader reads every safetensors file in the folder
        raise WeightSyncError(f"the weight-sync folder {folder} holds other safetensors files {foreign[:3]}; "
                              f"Fix: give sync_weights a scratch folder of its own")
    path, tmp = folder / WEIGHTS_FILE, folder / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)
    return path.stat().st_size


def resolve_model_dir(model: str) -> Path:
    """The local folder of the engine's model (a Hub id resolves to its cached snapshot)."""
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors"]))


@lru_cache(maxsize=8)
def checkpoint_layout(model_dir: Path) -> dict[str, tuple[int, ...]] | None:
    """Name -> shape of every tensor in the model's safetensors checkpoint (headers only); None without one."""
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    layout = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            layout.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return layout


@lru_cache(maxsize=8)
def tied_embeddings(model_dir: Path) -> bool:
    from transformers import AutoConfig

    return bool(getattr(AutoConfig.from_pretrained(model_dir).get_text_config(), "tie_word_embeddings", False))


def _scratch_folder(engine: VLLMEngine, scratch: str | Path | None) -> Path:
    if scratch is not None:
        return Path(scratch)
    if engine not in _SCRATCH:
        _SCRATCH[engine] = tempfile.TemporaryDirectory(prefix="hubgym-weights-")
    return Path(_SCRATCH[engine].name)
