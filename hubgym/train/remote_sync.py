"""Online rollouts from a separate vLLM server, and the trainer's weights pushed into it.

    engine = ServerEngine(model_dir, "http://10.0.0.2:8000/v1", max_model_len=4096)    # vllm.engine: server
    seconds = sync_remote_weights(engine, policy.full_state_dict(), policy_version=step, scratch=out / "sync")

Inference and training then sit on different GPUs or machines. `ServerEngine` is an `OpenAIEngine` in
`tokens` mode (token-in `/v1/completions`: the rows keep the sampled ids and logprobs), with the model's
tokenizer, the version of the weights it serves, and a `RemoteWeights` that pushes new ones through vLLM's
development and RL routes (a server started with `VLLM_SERVER_DEV_MODE=1`). Every push pauses the server
(`/pause?mode=wait`: running requests finish, new ones wait), loads the weights, drops the prefix cache (no
KV computed by the old weights is reused), labels the weights with the policy version and resumes it.

Two transfers (`vllm.weight_transfer`):
- `file` (works everywhere, the one tested here): the weights go to one safetensors file in a folder that
  the trainer writes and the server reads at the same path (one machine, or a shared disk), and the
  server's workers reload it in place (`/collective_rpc` `reload_weights`), as the local engine does.
  Measured on 2 busy CPU cores, a push end to end: the tiny model ~0.08 s, SmolLM2-135M (538 MB fp32) 2-4 s.
- `nccl` (GPUs only; written against vLLM 0.32's weight-transfer API, NOT run in hubgym's tests, which
  have no GPU): the trainer joins the server's workers in an NCCL group (`/init_weight_transfer_engine`,
  once) and broadcasts the tensors GPU to GPU each push (`/start_weight_update`, `/update_weights`,
  `/finish_weight_update`). The server must be started with
  `--weight-transfer-config '{"backend": "nccl"}'`, and its workers must reach the trainer's address.

Checked when the engine is made, one line each: a server that does not answer, one without the dev
routes, one that serves another model.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from hubgym.errors import EngineError, WeightSyncError
from hubgym.engines import OpenAIEngine
from hubgym.train.sync import (NamedTensors, checkpoint_layout, prepare_weights, resolve_model_dir, tied_embeddings,
                               write_weights)

log = logging.getLogger("hubgym.train")

SETTING = "vllm.base_url"


class ServerEngine(OpenAIEngine):
    """A vLLM server that samples the trainer's online rollouts and takes its weights (see the module doc).

    model_dir: the trainer's model folder (its tokenizer renders prompts; its checkpoint checks pushed weights);
    served_model: the name the server serves it under (default: the one model it serves, if it is that folder);
    transfer / sync_dir / nccl_address: as `RemoteWeights`."""

    name = "vllm-server"

    def __init__(self, model_dir: str, base_url: str, *, max_model_len: int = 1024, served_model: str | None = None,
                 transfer: str = "file", sync_dir: str | Path | None = None, nccl_address: str | None = None,
                 timeout_s: float = 120.0):
        from transformers import AutoTokenizer

        root = server_root(base_url)
        listed = _served_models(root, base_url)
        served = _pick_model(listed, model_dir, served_model, base_url)
        limit = min(max_model_len, listed[served] or max_model_len)  # the server refuses longer requests
        super().__init__(served, base_url, mode="tokens", max_model_len=limit, timeout_s=timeout_s)
        self.model_dir, self.policy_version = str(model_dir), 0
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.weights = RemoteWeights(root, model_dir, transfer=transfer, sync_dir=sync_dir,
                                     nccl_address=nccl_address, base_url=base_url)

    def alive(self) -> bool:
        """Whether the server answers its health check."""
        return _request(self.weights.root, "GET", "/health", timeout=5.0, base_url=self.base_url,
                        quiet=True) is not None

    def restart(self) -> None:
        """hubgym does not own the server: a dead one is one error line, not a restart."""
        raise EngineError(f"the vLLM server at {self.base_url} ({SETTING}) is not answering or failed; restart it "
                          f"(with VLLM_SERVER_DEV_MODE=1), then re-run the training command to resume")


class RemoteWeights:
    """Pushes weights into the vLLM server at `root` (its address without /v1). transfer 'file': the weights go to
    `sync_dir` (or the folder each call names), which the server must read at the same path; 'nccl': GPU to GPU
    (the module doc). Checks at once that the server has the dev routes a push needs."""

    PUSH_TIMEOUT_S = 600.0  # a reload that takes longer means the server is stuck

    def __init__(self, root: str, model_dir: str, *, transfer: str = "file", sync_dir: str | Path | None = None,
                 nccl_address: str | None = None, base_url: str | None = None):
        if transfer not in ("file", "nccl"):
            raise ValueError(f"vllm.weight_transfer is {transfer!r}; use 'file' or 'nccl'")
        self.root, self.model_dir, self.transfer = root.rstrip("/"), str(model_dir), transfer
        self.base_url = base_url or self.root + "/v1"
        self.sync_dir = Path(sync_dir).resolve() if sync_dir else None
        self.nccl_address, self._nccl, self._source = nccl_address, None, None
        if transfer == "nccl":
            _require_cuda()
        self._require_dev_routes()

    def _require_dev_routes(self) -> None:
        if self._call("GET", "/is_paused", missing_ok=True) is None:
            raise EngineError(f"the vLLM server at {self.base_url} ({SETTING}) has no weight-update routes "
                              f"(/collective_rpc, /pause, ...); start it with VLLM_SERVER_DEV_MODE=1 in its "
                              f"environment so the trainer can push its weights")

    def sync(self, engine: ServerEngine | None, named_tensors: NamedTensors, policy_version: int,
             scratch: str | Path | None = None) -> float:
        """Serve `named_tensors` (Hugging Face names) from the server as `policy_version`; returns the seconds.
        `engine` (if given) records the version, which the next rollouts carry as their policy_version."""
        started = time.perf_counter()
        model_dir = resolve_model_dir(self.model_dir)
        tensors = prepare_weights(named_tensors, checkpoint_layout(model_dir), tied_embeddings(model_dir),
                                  model=self.model_dir)
        self._call("POST", "/pause?mode=wait&clear_cache=false")  # running requests finish, new ones wait
        try:
            self._load(tensors, policy_version, scratch)
        except BaseException:
            _request(self.root, "POST", "/resume", timeout=30.0, base_url=self.base_url, quiet=True)  # best effort
            raise
        self._call("POST", "/resume")
        if engine is not None:
            engine.policy_version = policy_version
        seconds = time.perf_counter() - started
        log.info("weights v%d pushed to the vLLM server at %s in %.3fs (%s, %d tensors)", policy_version, self.root,
                 seconds, self.transfer, len(tensors))
        return seconds

    def _load(self, tensors: dict, policy_version: int, scratch: str | Path | None) -> None:
        """On the paused server: the weights in, the prefix cache out, the version on."""
        if self.transfer == "file":
            self._push_file(tensors, scratch)
        else:
            self._push_nccl(tensors)
        reset = self._call("POST", "/reset_prefix_cache") or {}
        if not reset.get("success", False):
            raise EngineError(f"the vLLM server at {self.base_url} could not drop its prefix cache after loading "
                              f"weights v{policy_version} (blocks still held); push again")
        self._call("POST", "/update_weight_version", {"new_version": str(policy_version)})

    def version(self) -> str | None:
        """The weight version the server reports (`/weight_info`)."""
        return (self._call("GET", "/weight_info") or {}).get("weight_version")

    def _push_file(self, tensors: dict, scratch: str | Path | None) -> None:
        folder = self.sync_dir or (Path(scratch).resolve() if scratch else None)
        if folder is None:
            raise WeightSyncError("vllm.weight_transfer=file needs a folder the server can read; set vllm.sync_dir")
        write_weights(tensors, folder)
        self._call("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)},
                                                "timeout": self.PUSH_TIMEOUT_S})

    def _push_nccl(self, tensors: dict) -> None:
        """vLLM's dense NCCL transfer: the group is made on the first push; each push broadcasts every tensor."""
        if self._nccl is None:
            self._nccl = self._nccl_init()
        self._source.tensors = tensors
        self._nccl.send_weights()

    def _nccl_init(self) -> Any:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        from hubgym.engines.server import free_port

        workers = int((self._call("GET", "/get_world_size") or {}).get("world_size", 1))
        address = self.nccl_address or _route_address(self.root)
        info = NCCLTrainerInitInfo(master_address=address, master_port=free_port(), world_size=workers + 1, rank=0)
        self._source = _tensor_source()
        return WeightTransferTrainerFactory.trainer_init(info, client=HTTPVLLMWeightSyncClient(self.root),
                                                         source=self._source)

    def _call(self, method: str, path: str, body: dict | None = None, *, missing_ok: bool = False) -> Any:
        return _request(self.root, method, path, body, timeout=self.PUSH_TIMEOUT_S, base_url=self.base_url,
                        missing_ok=missing_ok)


def sync_remote_weights(engine: ServerEngine, named_tensors: NamedTensors, policy_version: int,
                        scratch: str | Path | None = None) -> float:
    """`sync_weights` for a server: push `named_tensors` into `engine`'s server as `policy_version`; the seconds."""
    return engine.weights.sync(engine, named_tensors, policy_version, scratch)


def _tensor_source() -> Any:
    """vLLM's `WeightSource` over the tensors of the current push (set `.tensors` before each), moved to this
    process's GPU as they are sent. Defined when first needed: it subclasses a vLLM class."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class TensorSource(WeightSource):
        def __init__(self) -> None:
            self.tensors: dict = {}

        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.tensors.items()]

        def __iter__(self):
            for name, tensor in self.tensors.items():
                yield name, tensor.to("cuda", non_blocking=True)

    return TensorSource()


def server_root(base_url: str) -> str:
    """The server's address without the OpenAI path: where /health and the dev routes live."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _served_models(root: str, base_url: str) -> dict[str, int | None]:
    """Model name -> max_model_len of every model the server lists; a server that does not answer is one line."""
    data = _request(root, "GET", "/v1/models", timeout=10.0, base_url=base_url)
    return {m["id"]: m.get("max_model_len") for m in (data or {}).get("data", [])}


def _pick_model(listed: dict[str, int | None], model_dir: str, served_model: str | None, base_url: str) -> str:
    """The server's name for the trainer's model: `served_model` if given, else the folder's own path (the name
    `--model DIR` gives it). Anything else is another model: pushing these weights into it would fail half way."""
    wanted = served_model or str(model_dir)
    if wanted in listed:
        return wanted
    if served_model is None and str(Path(model_dir).resolve()) in listed:
        return str(Path(model_dir).resolve())
    raise EngineError(f"the vLLM server at {base_url} ({SETTING}) serves {sorted(listed)}, not the trainer's model "
                      f"{wanted!r}; start it with --model {model_dir} (the same weights), or set vllm.served_model to "
                      f"the name it serves that model under")


def _request(root: str, method: str, path: str, body: dict | None = None, *, timeout: float, base_url: str,
             missing_ok: bool = False, quiet: bool = False) -> Any:
    """One JSON call to the server. No answer: EngineError naming vllm.base_url (None when `quiet`); a 404 with
    `missing_ok`: None; another HTTP error: EngineError with the server's own message."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(root + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
    except urllib.error.HTTPError as exc:
        if quiet:
            return None
        if exc.code == 404 and missing_ok:
            return None
        detail = exc.read().decode(errors="replace")[:500]
        raise EngineError(f"the vLLM server at {base_url} ({SETTING}) answered {method} {path} with HTTP {exc.code}: "
                          f"{detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        if quiet:
            return None
        reason = getattr(exc, "reason", exc)
        raise EngineError(f"no vLLM server answers at {base_url} ({SETTING}): {reason}; start one "
                          f"(VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model MODEL) or "
                          f"fix {SETTING}") from None
    return json.loads(payload) if payload.strip() else {}


def _require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise EngineError("vllm.weight_transfer=nccl broadcasts from the trainer's GPU, but this machine has no CUDA "
                          "GPU; use vllm.weight_transfer=file (a folder the server reads)")


def _route_address(root: str) -> str:
    """This machine's address on the route to the server (what the server's workers connect back to)."""
    host = urllib.parse.urlparse(root).hostname or "127.0.0.1"
    port = urllib.parse.urlparse(root).port or 80
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))  # no packet is sent: this only picks the interface
        return sock.getsockname()[0]
