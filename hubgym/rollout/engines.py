"""Engines turn a prompt into `n` sampled continuations with token ids and logprobs.

Two engines, one async interface:
- `VLLMEngine`: vLLM's offline `LLM` in this process. Requests from concurrent trajectories are
  gathered into one `LLM.generate` call (turn-level batching), run in a worker thread.
- `OpenAIEngine`: any OpenAI-compatible server (a `vllm` server in production, hosted APIs for
  evaluation) through the `openai` async client, in `tokens` mode (token-in `/v1/completions`,
  text tool-call parsing), `chat` mode (`/v1/chat/completions`, the server's template and tool
  parser) or `chat_tokens` mode (token-in `/v1/chat/completions`, the server's tool parser).

vLLM, torch and openai are imported when an engine is created, never by `import hubgym`.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from hubgym.errors import EngineError, RequestError
from hubgym.schemas.messages import Message, ToolCall


@dataclass(frozen=True)
class SamplingArgs:
    """Sampling arguments shared by every engine (recorded in each rollout's provenance)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128  # per turn, unless the task's interaction spec says otherwise
    seed: int = 0  # per-request seeds derive from it, so a run is reproducible
    regex: str | None = None  # constrain every reply to this regular expression (vLLM structured outputs)

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


class VLLMEngine:
    """vLLM's offline engine with turn-level batching across concurrent trajectories."""

    name, token_in = "vllm", True

    def __init__(self, model: str, *, max_model_len: int = 1024, seed: int = 0, **engine_args: Any):
        # vLLM's CPU backend otherwise reserves most of the machine's memory for KV cache (GiB; ignored on GPUs).
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        import vllm

        self.model, self.max_model_len, self.version = model, max_model_len, vllm.__version__
        # Per-request seeds make runs reproducible; vLLM's CPU sampler cannot rewind a seeded generator
        # after a partial (chunked) prefill, so prompts are prefilled whole.
        defaults = {"dtype": "float32", "enable_chunked_prefill": False,
                    "max_num_batched_tokens": max(8192, max_model_len)}
        self.llm = vllm.LLM(model=model, max_model_len=max_model_len, seed=seed, enable_prefix_caching=True,
                            **{**defaults, **engine_args})
        self.tokenizer = self.llm.get_tokenizer()
        self._queue: list[tuple[Request, SamplingArgs, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    async def generate(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((request, sampling, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        """Let every ready trajectory enqueue, then run the whole queue as one batch; repeat."""
        while self._queue:
            quiet = 0
            while quiet < 3:  # until 3 event-loop rounds add no request: every ready trajectory is in
                size = len(self._queue)
                await asyncio.sleep(0)
                quiet = quiet + 1 if len(self._queue) == size else 0
            batch, self._queue = self._queue, []
            try:
                results = await asyncio.to_thread(self._generate_isolated, [(r, s) for r, s, _ in batch])
            except Exception as exc:  # the engine itself failed: every waiting trajectory learns it
                for _, _, future in batch:
                    future.set_exception(EngineError(f"vLLM generate failed: {type(exc).__name__}: {exc}"))
                continue
            for (_, _, future), result in zip(batch, results):
                if isinstance(result, RequestError):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _generate_isolated(self, batch: list[tuple[Request, SamplingArgs]]) -> list[list[Sample] | RequestError]:
        """One batched call. vLLM refuses a whole batch when it refuses one request in it (too long, a token
        out of vocabulary, a bad constraint), so the batch is then re-run one request at a time: only the bad
        request fails, with a RequestError; an engine that is down still raises."""
        from vllm.exceptions import VLLMClientError

        try:
            return self._generate_batch(batch)
        except VLLMClientError as exc:
            if len(batch) == 1:
                return [RequestError(f"vLLM refused the request: {exc}")]
        results: list[list[Sample] | RequestError] = []
        for item in batch:
            try:
                results += self._generate_batch([item])
            except VLLMClientError as exc:
                results.append(RequestError(f"vLLM refused the request: {exc}"))
        return results

    def sampling_params(self, request: Request, sampling: SamplingArgs) -> Any:
        """The vLLM `SamplingParams` of one request. A subclass may add constraints here (e.g.
        `structured_outputs` to force a format); logprobs=0 returns the sampled token's logprob."""
        from vllm import SamplingParams

        params = SamplingParams(n=request.n, temperature=sampling.temperature, top_p=sampling.top_p,
                                max_tokens=request.max_tokens, seed=request.seed, logprobs=0)
        if sampling.regex:
            from vllm.sampling_params import StructuredOutputsParams

            params.structured_outputs = StructuredOutputsParams(regex=sampling.regex)
        return params

    def _generate_batch(self, batch: list[tuple[Request, SamplingArgs]]) -> list[list[Sample]]:
        prompts = [{"prompt_token_ids": r.ids} for r, _ in batch]
        params = [self.sampling_params(r, s) for r, s in batch]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[_sample_from_vllm(c, out.prompt_token_ids) for c in out.outputs] for out in outputs]

    def close(self) -> None:
        self.llm = None  # vLLM shuts its engine core down when the LLM is collected


def _sample_from_vllm(completion: Any, prompt_ids: list[int]) -> Sample:
    logprobs = [entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs or [])]
    return Sample(list(completion.token_ids), logprobs, completion.text, completion.finish_reason or "stop",
                  list(prompt_ids))


class OpenAIEngine:
    """An OpenAI-compatible server through the `openai` async client, in one of three modes:

    - `tokens`: token-in `/v1/completions` (`prompt=[ids]`); tool calls are parsed from the text by
      the loop. Needs a server that returns token ids (vLLM's `return_token_ids`).
    - `chat`: `/v1/chat/completions`; the server renders the messages with its chat template and
      its tool parser returns native tool calls. Works with hosted APIs (no token ids there). The
      loop checks that each turn's server-rendered prompt extends the stored tokens; it does not
      when the model sampled a non-canonical tokenization of its reply (re-tokenization drift).
    - `chat_tokens`: `/v1/chat/completions` with the stored ids as the prompt (vLLM reads them from
      `kv_transfer_params.prompt_token_ids` and skips templating): token-in like `tokens`, native
      tool calls like `chat`. The engine checks the server really used the ids.

    Connection failures, timeouts, 429 and 5xx are retried by the client (`max_retries`, exponential
    backoff); what still fails, and 401/403/404 (wrong key or model: every request would fail),
    raise `EngineError` naming the server. Any other 4xx fails one request: `RequestError`.
    `extra_body` is merged into every request body, e.g. `{"structured_outputs": {"regex": ...}}`.
    `return_token_ids=False` (chat mode only) leaves out vLLM's field for hosted APIs that refuse
    unknown fields; their rows then carry no token ids. `api_key` defaults to $OPENAI_API_KEY.
    """

    name = "openai"
    MODES = ("tokens", "chat", "chat_tokens")

    def __init__(self, model: str, base_url: str, *, mode: str = "tokens", api_key: str | None = None,
                 max_model_len: int = 1024, max_retries: int = 4, timeout_s: float = 120.0, concurrency: int = 256,
                 extra_body: dict[str, Any] | None = None, return_token_ids: bool = True):
        import openai

        if mode not in self.MODES:
            raise ValueError(f"OpenAIEngine mode is {mode!r}; use one of {self.MODES}")
        if mode != "chat" and not return_token_ids:
            raise ValueError(f"OpenAIEngine mode {mode!r} is token-in and needs return_token_ids=True; "
                             f"use mode 'chat' for servers without token ids")
        self.model, self.base_url, self.mode, self.max_model_len = model, base_url, mode, max_model_len
        self.token_in = mode in ("tokens", "chat_tokens")
        self.version = f"openai-{openai.__version__}"
        self.max_retries, self.timeout_s, self.concurrency = max_retries, timeout_s, concurrency
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # vLLM accepts any key
        self.extra_body, self.return_token_ids = dict(extra_body or {}), return_token_ids
        self._fatal = (openai.APIConnectionError, openai.AuthenticationError, openai.PermissionDeniedError,
                       openai.NotFoundError, openai.RateLimitError, openai.InternalServerError)
        self._refused = openai.APIStatusError
        self._loop: asyncio.AbstractEventLoop | None = None

    def _bind(self) -> None:
        """One client and semaphore per event loop: each `run_rollouts` call runs its own loop."""
        import openai

        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._limit = loop, asyncio.Semaphore(self.concurrency)
            self.client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key,
                                             max_retries=self.max_retries, timeout=self.timeout_s)

    async def generate(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        self._bind()
        async with self._limit:
            try:
                if self.mode == "tokens":
                    return await self._tokens(request, sampling)
                return await self._chat(request, sampling)
            except self._fatal as exc:  # the client already retried with backoff
                raise EngineError(f"OpenAI-compatible server at {self.base_url} failed after {self.max_retries} "
                                  f"retries ({type(exc).__name__}: {str(exc)[:500]}); check the server is up and "
                                  f"serves model {self.model!r}, then re-run to resume") from exc
            except self._refused as exc:
                raise RequestError(f"server at {self.base_url} refused the request: {str(exc)[:1000]}") from exc

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
        """POST through the client (retries, backoff, typed errors) without its request-typing pass, which
        walks a token-id prompt element by element, and without building response models: plain JSON."""
        resp = await self.client.post(path, body=body, cast_to=object)
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


def _floats(values: list[float | None] | None) -> list[float]:
    """Per-token logprobs; none at all when any is missing (the loop then flags the record)."""
    values = list(values or [])
    return [] if any(v is None for v in values) else [float(v) for v in values]
