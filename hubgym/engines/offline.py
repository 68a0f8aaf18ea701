"""`VLLMEngine`: vLLM's offline `LLM` in this process, with continuous batching: a serving thread hands each
request to vLLM's engine as soon as a trajectory makes it, so it joins the running batch.

vLLM and torch are imported when the engine is created, never by `import hubgym`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

from hubgym.engines.base import Request, Sample, SamplingArgs
from hubgym.engines.reaper import engine_process_env
from hubgym.engines.exit_report import quiet_exit_report
from hubgym.engines.settings import EngineSettings, compile_cache_env
from hubgym.engines.vllm_logging import apply_vllm_log_level, vllm_verbose
from hubgym.errors import EngineError, RequestError

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

    def __init__(self, model: str, *, max_model_len: int | None = 1024, seed: int = 0,
                 settings: EngineSettings = EngineSettings(), separate_core: bool = False, **engine_args: Any):
        """`settings`: dtype, memory share, GPUs, sleep mode (checked first); `engine_args`: any further vLLM
        engine argument, e.g. enforce_eager=True. `separate_core`: vLLM's engine core runs in a process of its
        own even where VLLM_ENABLE_V1_MULTIPROCESSING=0 asks for this one, as the trainer wants before it starts
        its process group (it always does once this process holds one: a core here would take that group over
        and tear it down when it stops)."""
        from hubgym.models import context_length

        # None: the model's own limit; one past it is refused here, not deep inside vLLM's config validation.
        max_model_len = context_length(model, max_model_len)
        # vLLM's CPU backend otherwise reserves most of the machine's memory for KV cache (GiB; ignored on GPUs).
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        apply_vllm_log_level()  # before vLLM is imported: its INFO and WARNING lines stay out of hubgym's output
        quiet_exit_report()  # no page of triton's binding report after a program's own output (exit_report.py)
        import vllm

        os.environ.update(compile_cache_env())
        self.model, self.max_model_len, self.version = model, max_model_len, vllm.__version__
        checked = settings.vllm_args()
        # Per-request seeds make runs reproducible; vLLM's CPU sampler cannot rewind a seeded generator
        # after a partial (chunked) prefill, so prompts are prefilled whole.
        defaults = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(8192, max_model_len),
                    "use_tqdm_on_load": vllm_verbose(),
                    "worker_extension_cls": "hubgym.train.vllm_receiver.WeightReceiver",  # in-memory weight sync
                    **_worker_in_core(checked)}
        self.llm_args = {"model": model, "max_model_len": max_model_len, "seed": seed, "enable_prefix_caching": True,
                         **defaults, **checked, **engine_args}  # kept so `restart` builds the same engine
        self.separate_core = separate_core
        self.policy_version = 0  # the version of the weights served (set by `load_weights`)
        self.weights_path: str | None = None  # the folder they were loaded from; None: `model`'s own weights
        self._start()
        self._inbox: queue.SimpleQueue[tuple[str, _Waiter]] = queue.SimpleQueue()  # ("add" | "abort", waiter)
        self._ids = itertools.count()
        self._server: threading.Thread | None = None
        self._server_lock = threading.Lock()

    def _start(self) -> None:
        import vllm

        _collect_dropped_engines()
        separate = self.separate_core or _holds_process_group()
        with _without_rendezvous_env(), engine_process_env(), _separate_core(separate), _frozen_heap(separate):
            self.llm = vllm.LLM(**self.llm_args)  # vLLM's processes die with this one (reaper.py)
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
        if self._core_in_this_process():
            return True
        resources = self.llm.llm_engine.engine_core.resources
        processes = getattr(resources.engine_manager, "processes", [])
        return not resources.engine_dead and all(_running(p.pid) for p in processes)

    def _core_in_this_process(self) -> bool:
        """The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): vLLM's client has no
        processes (`resources`) to watch."""
        return getattr(self.llm.llm_engine.engine_core, "resources", None) is None

    def restart(self) -> None:
        """A fresh engine with the same arguments, serving the last loaded weights under the same version."""
        self._shut_down()
        self._start()
        if self.weights_path is not None:
            self.load_weights(self.weights_path, self.policy_version)

    def close(self) -> None:
        self._shut_down()

    def _shut_down(self) -> None:
        """Stop the engine core (a no-op when vLLM already shut a dead one down). A core that ran in this process
        also leaves torch.distributed's global group and vLLM's parallel state behind: they are torn down, so a
        later engine or a trainer in this process starts clean."""
        if self.llm is None:
            return
        in_process = self._core_in_this_process()
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        if in_process:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()




def _worker_in_core(checked: dict[str, Any]) -> dict[str, Any]:
    """On a CPU, the model's one worker runs in the engine core's process, as it does on a GPU.

    vLLM's CPU backend turns its one-process executor into a process of its own whenever the engine core has
    one (`hubgym train`'s engines, vLLM's default layout), to start that process with torch's OpenMP preloaded.
    The core's process is started with the same preload, so the worker loses nothing there; it saves a process
    that imports torch and vLLM again. bench/bench_worker.py, the tiny model on 2 cores: the engine starts in
    0.64x the time with 0.71x the CPU seconds and decodes at 1.09x the tokens/s (no hop between core and worker).
    Naming the executor class (not "uni") keeps vLLM's CPU backend from swapping it."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or checked.get("tensor_parallel_size", 1) != 1:
        return {}
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    return {"distributed_executor_backend": UniProcExecutor}


def _collect_dropped_engines() -> None:
    """Finish off engines dropped without `close()` (held by a reference cycle) before another one starts.

    vLLM tears a core that ran in this process down in a finalizer, whenever the garbage collector reaches the
    dropped engine; the core freezes the heap when it starts, so that can be long after, once some engine's
    `close()` unfreezes it. The teardown ends this process's torch.distributed group and vLLM's parallel state,
    which a core started since shares: the newer engine lost its groups mid-start ("tensor model parallel group is
    not initialized"). Until then the dropped core's group also made every new engine start a core process of its
    own. Collected here, a dropped engine is gone before the new one looks at the process group."""
    import gc

    gc.unfreeze()
    gc.collect()


@contextlib.contextmanager
def _frozen_heap(separate_core: bool) -> Iterator[None]:
    """The objects alive before vLLM starts are left out of its garbage collections (`gc.freeze`, what vLLM does
    itself once its engine has started). vLLM collects five times while it starts (twice around loading the
    model, three times before freezing), and each collection walked every object torch, transformers and vLLM
    hold: about 0.4 s a time on a CPU core, 2 s an engine start. A core in this process ends its start by freezing
    the heap and unfreezes it when it closes; otherwise the heap is given back as it was."""
    import gc

    gc.freeze()
    try:
        yield
    except BaseException:
        gc.unfreeze()
        raise
    if separate_core:
        gc.unfreeze()


RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")
"""The process group variables a launcher (torchrun, deepspeed) or hubgym's own one-process group sets."""


@contextlib.contextmanager
def _without_rendezvous_env() -> Iterator[None]:
    """A trainer's process group variables (RANK, MASTER_PORT, ...) would make vLLM's engine process join or
    collide with the trainer's process group: vLLM starts (and restarts) without them."""
    saved = {k: os.environ.pop(k) for k in RENDEZVOUS_VARIABLES if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@contextlib.contextmanager
def _separate_core(wanted: bool) -> Iterator[None]:
    """VLLM_ENABLE_V1_MULTIPROCESSING=1 while vLLM builds an engine, if `wanted` (vLLM reads it then)."""
    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if wanted:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    try:
        yield
    finally:
        if wanted and saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        elif wanted:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def _holds_process_group() -> bool:
    """Whether this process is in a torch.distributed group (a trainer's), without importing torch for it."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


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
