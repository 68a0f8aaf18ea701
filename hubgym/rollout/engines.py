"""Engines turn a prompt into `n` sampled continuations with token ids and logprobs.

Two engines, one async interface:
- `VLLMEngine`: vLLM's offline `LLM` in this process, with continuous batching: a serving thread
  hands each request to vLLM's engine as soon as a trajectory makes it, so it joins the running batch.
- `OpenAIEngine`: any OpenAI-compatible server (a `vllm` server in production, hosted APIs for
  evaluation) over HTTP (aiohttp, `http_json`), in `tokens` mode (token-in `/v1/completions`,
  text tool-call parsing), `chat` mode (`/v1/chat/completions`, the server's template and tool
  parser) or `chat_tokens` mode (token-in `/v1/chat/completions`, the server's tool parser).

vLLM, torch and aiohttp are imported when an engine is created, never by `import hubgym`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Protocol

from hubgym.errors import EngineError, RequestError, SettingError
from hubgym.rollout.reaper import engine_process_env
from hubgym.rollout.vllm_logging import apply_vllm_log_level, vllm_verbose
from hubgym.schemas.messages import Message, ToolCall


@dataclass(frozen=True)
class SamplingArgs:
    """Sampling arguments shared by every engine (recorded in each rollout's provenance)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128  # per turn, unless the task's interaction spec says otherwise
    seed: int = 0  # per-request seeds derive from it, so a run is reproducible
    regex: str | None = None  # constrain every reply to this regular expression (vLLM structured outputs)

    def __post_init__(self) -> None:
        """NaN or infinity reaches vLLM as a sampling parameter it does not refuse: a run of nonsense, not an error."""
        rules = {"temperature": (lambda v: v >= 0, ">= 0"), "top_p": (lambda v: 0 < v <= 1, "in (0, 1]")}
        for name, (ok, rule) in rules.items():
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and ok(value)):
                raise SettingError(f"sampling {name}={value!r} must be a finite number {rule}, e.g. "
                                   f"{name}={1.0 if name == 'top_p' else 0.7}", setting=name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Request:
    """One generation request: `ids` for token-in engines, `messages` + `tools` for chat mode."""

    ids: list[int]
    messages: list[Message]
    tools: list[dict] | None
    n: int
    max_tokens: int
    seed: int


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length" | "tool_calls" | ...
    prompt_ids: list[int] = field(default_factory=list)  # as the engine saw it (chat mode: the server's rendering)
    tool_calls: list[ToolCall] | None = None  # native tool calls (chat mode only)


class Engine(Protocol):
    name: str
    version: str
    model: str
    max_model_len: int
    token_in: bool  # True: the engine consumes Request.ids; False: it renders Request.messages itself

    async def generate(self, request: Request, sampling: SamplingArgs) -> list[Sample]: ...

    def close(self) -> None: ...


@dataclass
class _Waiter:
    """A request on its way through VLLMEngine's serving thread, and the event loop waiting for its samples."""

    request: Request
    sampling: SamplingArgs
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    request_id: str = ""  # the id given to vLLM, once added

    def resolve(self, result: list[Sample] | Exception) -> None:
        """Hand the result to the waiting coroutine (from the serving thread: through its event loop)."""
        def settle() -> None:
            if self.future.done():  # cancelled meanwhile
                return
            if isinstance(result, Exception):
                self.future.set_exception(result)
            else:
                self.future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # that event loop is closed: nobody waits for this result any more
            pass


class VLLMEngine:
    """vLLM's offline engine with continuous batching across concurrent trajectories.

    Why not one `LLM.generate` call per batch of turns: it runs its batch to the end, so the engine
    would idle while hubgym scores and stores that batch and builds the next, and each batch would
    end in a shrinking tail. Instead one serving thread owns the engine: it adds each request the
    moment a trajectory makes it (`LLMEngine.add_request`, as `LLM.generate` does) and steps the
    engine while any request is unfinished, as vLLM's server does; hubgym's work overlaps generation.
    """

    IDLE_S = 1.0  # the serving thread ends after this long with nothing to do; the next request starts it
    RPC_TIMEOUT_S = 600.0  # a weight reload that takes longer means the engine is gone

    name, token_in = "vllm", True

    def __init__(self, model: str, *, max_model_len: int | None = 1024, seed: int = 0, dtype: str = "auto",
                 gpu_memory_utilization: float | None = None, tensor_parallel_size: int = 1,
                 enable_sleep_mode: bool = False, **engine_args: Any):
        from hubgym.models import context_length

        # None: the model's own limit; one past it is refused here, not deep inside vLLM's config validation.
        max_model_len = context_length(model, max_model_len)
        # vLLM's CPU backend otherwise reserves most of the machine's memory for KV cache (GiB; ignored on GPUs).
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        apply_vllm_log_level()  # before vLLM is imported: its INFO and WARNING lines stay out of hubgym's output
        import vllm

        self.model, self.max_model_len, self.version = model, max_model_len, vllm.__version__
        settings = engine_settings(dtype, gpu_memory_utilization, tensor_parallel_size, enable_sleep_mode)
        # Per-request seeds make runs reproducible; vLLM's CPU sampler cannot rewind a seeded generator
        # after a partial (chunked) prefill, so prompts are prefilled whole.
        defaults = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(8192, max_model_len),
                    "use_tqdm_on_load": vllm_verbose(),
                    "worker_extension_cls": "hubgym.train.vllm_receiver.WeightReceiver"}  # in-memory weight sync
        self.llm_args = {"model": model, "max_model_len": max_model_len, "seed": seed, "enable_prefix_caching": True,
                         **defaults, **settings, **engine_args}  # kept so `restart` builds the same engine
        self.policy_version = 0  # the version of the weights served (set by `load_weights`)
        self.weights_path: str | None = None  # the folder they were loaded from; None: `model`'s own weights
        self._start()
        self._inbox: queue.SimpleQueue[tuple[str, _Waiter]] = queue.SimpleQueue()  # ("add" | "abort", waiter)
        self._ids = itertools.count()
        self._server: threading.Thread | None = None
        self._server_lock = threading.Lock()

    def _start(self) -> None:
        import vllm

        with _without_rendezvous_env(), engine_process_env():  # vLLM's processes die with this one (reaper.py)
            self.llm = vllm.LLM(**self.llm_args)
        self.tokenizer = self.llm.get_tokenizer()
        self.sleeping = False  # a fresh engine is awake
        _fail_waiters_when_core_dies(self.llm)

    async def generate(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        self.wake_up()  # asleep since the last rollouts (enable_sleep_mode): the first request wakes it
        loop = asyncio.get_running_loop()
        waiter = _Waiter(request, sampling, loop.create_future(), loop)
        waiter.future.add_done_callback(lambda _: self._abort_if_cancelled(waiter))
        self._inbox.put(("add", waiter))
        self._ensure_serving()
        return await waiter.future

    def _abort_if_cancelled(self, waiter: _Waiter) -> None:
        if waiter.future.cancelled():  # the run stopped (an error elsewhere, Ctrl-C): stop generating for it
            self._inbox.put(("abort", waiter))

    def _ensure_serving(self) -> None:
        with self._server_lock:
            if self._server is None:
                self._server = threading.Thread(target=self._serve, name="vllm-serving", daemon=True)
                self._server.start()

    def _serve(self) -> None:
        """The serving thread: add what arrived, step the engine, hand finished requests to their waiters."""
        running: dict[str, _Waiter] = {}
        while True:
            try:
                messages = self._take(block=not running)
            except queue.Empty:  # idle: end, unless a request came in just now
                with self._server_lock:
                    if self._inbox.empty():
                        self._server = None
                        return
                continue
            try:
                for kind, waiter in messages:
                    if kind == "add":
                        self._add(waiter, running)
                    else:
                        self._abort(waiter, running)
                if running:
                    self._step(running)
            except Exception as exc:  # the engine failed (its core died, it was closed): every waiter learns it
                _fail_all(running, exc)

    def _take(self, block: bool) -> list[tuple[str, _Waiter]]:
        """Everything in the inbox; when `block`, wait up to IDLE_S for the first message (else queue.Empty)."""
        messages = [self._inbox.get(timeout=self.IDLE_S)] if block else []
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                return messages

    def _add(self, waiter: _Waiter, running: dict[str, _Waiter]) -> None:
        """Add one request to the engine. vLLM checks it here (length, token ids, constraints): a refused
        request fails alone, with a RequestError; an engine that is down fails it with an EngineError."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        if waiter.future.done():  # cancelled before it was added
            return
        waiter.request_id = f"hubgym-{next(self._ids)}"
        try:
            params = self.sampling_params(waiter.request, waiter.sampling)
            params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when all n samples end
            self.llm.llm_engine.add_request(waiter.request_id, tokens_input(list(waiter.request.ids)), params)
        except VLLMClientError as exc:
            waiter.resolve(RequestError(f"vLLM refused the request: {exc}"))
        except Exception as exc:
            waiter.resolve(EngineError(f"vLLM generate failed: {type(exc).__name__}: {exc}"))
        else:
            running[waiter.request_id] = waiter

    def _abort(self, waiter: _Waiter, running: dict[str, _Waiter]) -> None:
        if running.pop(waiter.request_id, None) is not None:
            self.llm.llm_engine.abort_request([waiter.request_id])

    def _step(self, running: dict[str, _Waiter]) -> None:
        """One engine step (one forward pass over the running batch); hands out the requests it finished."""
        for out in self.llm.llm_engine.step():
            if out.finished and out.request_id in running:
                samples = [_sample_from_vllm(c, out.prompt_token_ids) for c in out.outputs]
                running.pop(out.request_id).resolve(samples)

    def sampling_params(self, request: Request, sampling: SamplingArgs) -> Any:
        """The vLLM `SamplingParams` of one request. A subclass may add constraints here (e.g.
        `structured_outputs` to force a format); logprobs=0 returns the sampled token's logprob.

        The reply text keeps the special tokens the model sampled inside it (vLLM drops them by default; the end
        of turn it stopped on stays out): the text is then what the sampled ids say, so the verifier scores what
        the model wrote and the row passes the token audit (`tokens.audit_tokens`) instead of being left out."""
        from vllm import SamplingParams

        params = SamplingParams(n=request.n, temperature=sampling.temperature, top_p=sampling.top_p,
                                max_tokens=request.max_tokens, seed=request.seed, logprobs=0,
                                skip_special_tokens=False, spaces_between_special_tokens=False)
        if sampling.regex:
            from vllm.sampling_params import StructuredOutputsParams

            params.structured_outputs = StructuredOutputsParams(regex=sampling.regex)
        return params

    def load_weights(self, folder: str, policy_version: int) -> None:
        """Serve new weights without a restart. vLLM's worker reloads them in place from the safetensors files in
        `folder` (Hugging Face names: its loader maps them onto fused layers such as qkv and gate_up and redoes
        kernel repacking). The prefix cache is then dropped, so no KV computed by the old weights is reused, and
        vLLM labels the tokens it samples from now on with the version (`CompletionOutput.weight_versions`)."""
        if not self.alive():  # vLLM would wait forever for a dead engine core's answer
            raise EngineError("the vLLM engine is not running (its engine-core process died): restart it first")
        self.wake_up()
        try:
            self.llm.collective_rpc("reload_weights", timeout=self.RPC_TIMEOUT_S, kwargs={"weights_path": str(folder)})
        except TimeoutError as exc:
            raise EngineError(f"vLLM did not load the weights in {folder} within {self.RPC_TIMEOUT_S} s") from exc
        if not self.llm.reset_prefix_cache():
            raise EngineError("vLLM could not drop its prefix cache after loading weights: requests were running; "
                              "load weights between generate calls")
        self.llm.llm_engine.set_weight_version(str(policy_version))
        self.weights_path, self.policy_version = str(folder), policy_version

    def sleep(self) -> None:
        """Free the GPU memory vLLM holds while the trainer steps (enable_sleep_mode): level 1 moves the weights
        to CPU memory and drops the KV cache. Only between generate calls: nothing may be running."""
        if self.llm_args.get("enable_sleep_mode") and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake_up(self) -> None:
        """Bring the weights back and re-allocate the KV cache after `sleep`; a no-op when awake."""
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def alive(self) -> bool:
        """False once the engine is closed or a vLLM engine-core process (the model runs there) has died."""
        if self.llm is None:
            return False
        resources = getattr(self.llm.llm_engine.engine_core, "resources", None)
        if resources is None:  # the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
            return True
        processes = getattr(resources.engine_manager, "processes", [])
        return not resources.engine_dead and all(_running(p.pid) for p in processes)

    def restart(self) -> None:
        """A fresh engine with the same arguments, serving the last loaded weights under the same version."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()  # a no-op when vLLM already shut a dead core down
            self.llm = None
        self._start()
        if self.weights_path is not None:
            self.load_weights(self.weights_path, self.policy_version)

    def close(self) -> None:
        self.llm = None  # vLLM shuts its engine core down when the LLM is collected


DTYPES = ("auto", "bfloat16", "float16", "float32")


def engine_settings(dtype: str = "auto", gpu_memory_utilization: float | None = None, tensor_parallel_size: int = 1,
                    enable_sleep_mode: bool = False, *, setting: str = "vllm.") -> dict[str, Any]:
    """vLLM engine arguments for this machine, checked before vLLM sees them: a value it would refuse deep in its
    start-up (or, for a GPU count, hang on) is one line naming the setting (`setting` prefixes the names: "vllm."
    in a train config, "--" on the command line). dtype "auto" is vLLM's choice on a GPU (bfloat16 for an fp32
    checkpoint) but float32 on a CPU: vLLM's CPU backend would pick bfloat16 too, and rollouts there have always
    been sampled in the checkpoint's float32."""
    from vllm.platforms import current_platform

    def name(key: str) -> str:
        return setting + (key.replace("_", "-") if setting == "--" else key)

    if dtype not in DTYPES:
        raise EngineError(f"{name('dtype')}={dtype!r} is not a vLLM dtype; use one of {', '.join(DTYPES)}")
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise EngineError(f"{name('gpu_memory_utilization')}={gpu_memory_utilization} must be in (0, 1], the share "
                          f"of the GPU's memory vLLM takes; e.g. 0.3 beside a trainer, 0.9 alone")
    gpus = _visible_gpus(current_platform)
    if tensor_parallel_size < 1 or tensor_parallel_size > max(gpus, 1):
        where = f"{gpus} visible GPU(s)" if gpus else "no GPU (vLLM runs on the CPU here)"
        raise EngineError(f"{name('tensor_parallel_size')}={tensor_parallel_size} needs that many GPUs, but this "
                          f"machine has {where}; set it to {max(gpus, 1)} or less (CUDA_VISIBLE_DEVICES limits them)")
    if enable_sleep_mode and not current_platform.is_sleep_mode_available():
        raise EngineError(f"{name('enable_sleep_mode')}: vLLM's {current_platform.device_name} backend has no sleep "
                          f"mode (CUDA and ROCm GPUs do); leave it off here")
    args: dict[str, Any] = {"dtype": "float32" if dtype == "auto" and current_platform.is_cpu() else dtype,
                            "tensor_parallel_size": tensor_parallel_size}
    if gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = gpu_memory_utilization
    if enable_sleep_mode:
        args["enable_sleep_mode"] = True
    return args


def _visible_gpus(platform: Any) -> int:
    """GPUs vLLM could use here: 0 on its CPU backend."""
    if platform.is_cpu():
        return 0
    import torch

    return torch.accelerator.device_count() if hasattr(torch, "accelerator") else torch.cuda.device_count()


@contextlib.contextmanager
def _without_rendezvous_env() -> Iterator[None]:
    """A trainer's process group variables (RANK, MASTER_PORT, ...) would make vLLM's engine process join or
    collide with the trainer's process group: vLLM starts (and restarts) without them."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "ROLE_RANK", "TORCHELASTIC_RUN_ID")
    saved = {k: os.environ.pop(k) for k in names if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _running(pid: int | None) -> bool:
    """Whether process `pid` runs. By pid, not `multiprocessing.Process.is_alive()`: that reports a child that
    someone else already reaped as alive, and vLLM marks its engine dead only after its own clean-up."""
    import psutil

    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _fail_all(running: dict[str, _Waiter], exc: Exception) -> None:
    for waiter in running.values():
        waiter.resolve(EngineError(f"vLLM generate failed: {type(exc).__name__}: {exc}"))
    running.clear()


def _fail_waiters_when_core_dies(llm: Any) -> None:
    """vLLM marks its client dead when an engine-core process dies, but a `generate` already waiting for outputs
    would wait forever (the client's output thread stops without a word). A watcher thread hands that waiter
    vLLM's EngineDeadError instead. It holds the client's resources and queue, never the client, so the LLM can
    still be collected; it ends when the client is shut down (which also marks it dead)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    core = llm.llm_engine.engine_core
    resources, outputs = getattr(core, "resources", None), getattr(core, "outputs_queue", None)
    if resources is None or outputs is None:  # in-process engine core: nothing to watch
        return

    def watch() -> None:
        while not resources.engine_dead:
            time.sleep(0.2)
        outputs.put_nowait(EngineDeadError())

    threading.Thread(target=watch, name="vllm-core-watcher", daemon=True).start()


def _sample_from_vllm(completion: Any, prompt_ids: list[int]) -> Sample:
    logprobs = [entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs or [])]
    return Sample(list(completion.token_ids), logprobs, completion.text, completion.finish_reason or "stop",
                  list(prompt_ids))


class OpenAIEngine:
    """An OpenAI-compatible server over HTTP, in one of three modes:

    - `tokens`: token-in `/v1/completions` (`prompt=[ids]`); tool calls are parsed from the text by
      the loop. Needs a server that returns token ids (vLLM's `return_token_ids`).
    - `chat`: `/v1/chat/completions`; the server renders the messages with its chat template and
      its tool parser returns native tool calls. Works with hosted APIs (no token ids there). The
      loop checks that each turn's server-rendered prompt extends the stored tokens; it does not
      when the model sampled a non-canonical tokenization of its reply (re-tokenization drift).
    - `chat_tokens`: `/v1/chat/completions` with the stored ids as the prompt (vLLM reads them from
      `kv_transfer_params.prompt_token_ids` and skips templating): token-in like `tokens`, native
      tool calls like `chat`. The engine checks the server really used the ids.

    Requests go through `http_json.JSONClient` (aiohttp, msgspec), not the openai SDK, whose per-request
    work was most of the client's CPU at 64-256 requests in flight. Connection failures, timeouts, 408,
    409, 429 and 5xx are retried (`max_retries`, exponential backoff); what still fails, and 401/403/404
    (wrong key or model: every request would fail), raise `EngineError` naming the server. Any other
    4xx fails one request: `RequestError`.
    `extra_body` is merged into every request body, e.g. `{"structured_outputs": {"regex": ...}}`.
    `return_token_ids=False` (chat mode only) leaves out vLLM's field for hosted APIs that refuse
    unknown fields; their rows then carry no token ids. `api_key` defaults to $OPENAI_API_KEY.
    """

    name = "openai"
    MODES = ("tokens", "chat", "chat_tokens")

    def __init__(self, model: str, base_url: str, *, mode: str = "tokens", api_key: str | None = None,
                 max_model_len: int = 1024, max_retries: int = 4, timeout_s: float = 120.0, concurrency: int = 256,
                 extra_body: dict[str, Any] | None = None, return_token_ids: bool = True):
        import aiohttp  # noqa: F401 (the HTTP client: refused here, not at the first request, when missing)

        if mode not in self.MODES:
            raise ValueError(f"OpenAIEngine mode is {mode!r}; use one of {self.MODES}")
        if mode != "chat" and not return_token_ids:
            raise ValueError(f"OpenAIEngine mode {mode!r} is token-in and needs return_token_ids=True; "
                             f"use mode 'chat' for servers without token ids")
        self.model, self.base_url, self.mode, self.max_model_len = model, base_url, mode, max_model_len
        self.token_in = mode in ("tokens", "chat_tokens")
        self.version = f"openai-{_openai_version()}"
        self.max_retries, self.timeout_s, self.concurrency = max_retries, timeout_s, concurrency
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # vLLM accepts any key
        self.extra_body, self.return_token_ids = dict(extra_body or {}), return_token_ids
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _bind(self) -> None:
        """One client and semaphore per event loop: each `run_rollouts` call runs its own loop. The client's
        connections are closed when that loop ends (`_close_at_loop_end`)."""
        from hubgym.rollout.http_json import JSONClient

        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._limit = loop, asyncio.Semaphore(self.concurrency)
            self.client = JSONClient(self.base_url, api_key=self.api_key, max_retries=self.max_retries,
                                     timeout_s=self.timeout_s, connections=self.concurrency)
            self._closer = _close_at_loop_end(self.client)
            await self._closer.__anext__()

    async def generate(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        from hubgym.rollout.http_json import ServerRefused, ServerUnavailable

        await self._bind()
        async with self._limit:
            try:
                if self.mode == "tokens":
                    return await self._tokens(request, sampling)
                return await self._chat(request, sampling)
            except ServerUnavailable as exc:  # the client already retried with backoff
                raise self._down(exc) from exc
            except ServerRefused as exc:
                if exc.status in (401, 403, 404):  # wrong key, model or route: every request would fail
                    raise self._down(exc) from exc
                raise RequestError(f"server at {self.base_url} refused the request: {str(exc)[:1000]}") from exc

    def _down(self, exc: Exception) -> EngineError:
        return EngineError(f"OpenAI-compatible server at {self.base_url} failed after {self.max_retries} retries "
                           f"({type(exc).__name__}: {str(exc)[:500]}); check the server is up and serves model "
                           f"{self.model!r}, then re-run to resume")

    def _body(self, request: Request, sampling: SamplingArgs) -> dict[str, Any]:
        body = {**self.extra_body, "model": self.model, "n": request.n, "max_tokens": request.max_tokens,
                "seed": request.seed, "temperature": sampling.temperature, "top_p": sampling.top_p}
        if self.return_token_ids:
            body["return_token_ids"] = True
        if sampling.regex:
            body["structured_outputs"] = {**body.get("structured_outputs", {}), "regex": sampling.regex}
        if self.mode == "chat_tokens":
            body["kv_transfer_params"] = {**body.get("kv_transfer_params", {}), "prompt_token_ids": list(request.ids)}
        return body

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST through the client (retries, backoff, typed errors): plain JSON both ways."""
        resp = await self.client.post(path, body)
        if not isinstance(resp, dict) or not isinstance(resp.get("choices"), list):
            raise EngineError(f"the server at {self.base_url} answered {path} with no 'choices': {str(resp)[:300]}")
        resp["choices"].sort(key=lambda c: c.get("index") or 0)
        return resp

    async def _tokens(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        resp = await self._post("/completions", {**self._body(request, sampling), "prompt": list(request.ids),
                                                 "logprobs": 0})
        choices = resp["choices"]
        if any(c.get("token_ids") is None for c in choices):
            raise EngineError(f"the server at {self.base_url} returned no token ids; mode 'tokens' needs a vLLM "
                              f"server (request field return_token_ids); use mode 'chat' for other servers")
        return [Sample(list(c["token_ids"]), _floats((c.get("logprobs") or {}).get("token_logprobs")),
                       c.get("text") or "", c.get("finish_reason") or "stop",
                       list(c.get("prompt_token_ids") or request.ids)) for c in choices]

    async def _chat(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        from hubgym.schemas.messages import from_openai, to_openai

        body = {**self._body(request, sampling), "messages": [to_openai(m) for m in request.messages], "logprobs": True}
        if request.tools:
            body["tools"] = request.tools
        resp = await self._post("/chat/completions", body)
        prompt_ids = list(resp.get("prompt_token_ids") or [])
        if self.mode == "chat_tokens" and prompt_ids != list(request.ids):
            raise EngineError(f"the server at {self.base_url} did not take the prompt from "
                              f"kv_transfer_params.prompt_token_ids (a vLLM server >= 0.32 does); use mode 'tokens'")
        return [self._chat_sample(c, prompt_ids, from_openai) for c in resp["choices"]]

    def _chat_sample(self, choice: dict, prompt_ids: list[int], from_openai: Any) -> Sample:
        message = from_openai({**choice["message"], "role": "assistant"})
        logprobs = [t["logprob"] for t in ((choice.get("logprobs") or {}).get("content") or [])]
        finish = choice.get("finish_reason") or "stop"
        if self.mode == "chat_tokens" and finish == "tool_calls":
            finish = "stop"  # vLLM renames a natural stop that carried tool calls; the loop needs "stop" (EOS sampled)
        # tool_calls is a list, never None: the server's parser decided; the loop must not re-parse the text
        return Sample(list(choice.get("token_ids") or []), logprobs, message["content"] or "", finish, prompt_ids,
                      message["tool_calls"] or [])

    def close(self) -> None:
        self._loop = None  # the client's connections belong to a finished event loop; a new one is made on use


async def _close_at_loop_end(client: Any) -> Any:
    """An async generator left suspended: the event loop closes it when it shuts down (`asyncio.run` calls
    `shutdown_asyncgens`), which closes the client's connections in that loop, where they were opened."""
    try:
        yield
    finally:
        await client.close()


def _openai_version() -> str:
    """The openai package's version, recorded as before in each row's provenance ("none" without it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openai")
    except PackageNotFoundError:
        return "none"


def _floats(values: list[float | None] | None) -> list[float]:
    """Per-token logprobs; none at all when any is missing (the loop then flags the record)."""
    values = list(values or [])
    return [] if any(v is None for v in values) else [float(v) for v in values]
