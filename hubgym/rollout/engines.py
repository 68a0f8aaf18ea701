"""Engines turn a prompt into `n` sampled continuations with token ids and logprobs.

Two engines, one async interface:
- `VLLMEngine`: vLLM's offline `LLM` in this process. Requests from concurrent trajectories are
  gathered into one `LLM.generate` call (turn-level batching), run in a worker thread.
- `OpenAIEngine`: any OpenAI-compatible server (a `vllm` server in production, hosted APIs for
  evaluation) through the `openai` async client, in `tokens` mode (token-in `/v1/completions`,
  text tool-call parsing) or `chat` mode (`/v1/chat/completions`, the server's tool parser).

vLLM, torch and openai are imported when an engine is created, never by `import hubgym`.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from hubgym.schemas.messages import Message, ToolCall


@dataclass(frozen=True)
class SamplingArgs:
    """Sampling arguments shared by every engine (recorded in each rollout's provenance)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128  # per turn, unless the task's interaction spec says otherwise
    seed: int = 0  # per-request seeds derive from it, so a run is reproducible

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


class EngineError(RuntimeError):
    """The engine failed for every request (unreachable server, dead engine): the run stops, resumable."""


class RequestError(RuntimeError):
    """One request failed (e.g. the prompt is too long); recorded on its rows, the run goes on."""


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
            for _ in range(3):
                await asyncio.sleep(0)
            batch, self._queue = self._queue, []
            try:
                outputs = await asyncio.to_thread(self._generate_batch, [(r, s) for r, s, _ in batch])
            except Exception as exc:  # the engine itself failed: every waiting trajectory learns it
                for _, _, future in batch:
                    future.set_exception(EngineError(f"vLLM generate failed: {type(exc).__name__}: {exc}"))
                continue
            for (_, _, future), samples in zip(batch, outputs):
                future.set_result(samples)

    def _generate_batch(self, batch: list[tuple[Request, SamplingArgs]]) -> list[list[Sample]]:
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": r.ids} for r, _ in batch]
        params = [SamplingParams(n=r.n, temperature=s.temperature, top_p=s.top_p, max_tokens=r.max_tokens,
                                 seed=r.seed, logprobs=0) for r, s in batch]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[_sample_from_vllm(c, out.prompt_token_ids) for c in out.outputs] for out in outputs]

    def close(self) -> None:
        self.llm = None  # vLLM shuts its engine core down when the LLM is collected


def _sample_from_vllm(completion: Any, prompt_ids: list[int]) -> Sample:
    logprobs = [entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs or [])]
    return Sample(list(completion.token_ids), logprobs, completion.text, completion.finish_reason or "stop",
                  list(prompt_ids))


class OpenAIEngine:
    """An OpenAI-compatible server. `mode="tokens"` is token-in (vLLM servers); `"chat"` uses the server's
    chat template and tool parser (native tool calls; hosted APIs return no token ids)."""

    name = "openai"

    def __init__(self, model: str, base_url: str, *, mode: str = "tokens", api_key: str | None = None,
                 max_model_len: int = 1024, max_retries: int = 4, timeout_s: float = 120.0, concurrency: int = 64):
        import openai

        if mode not in ("tokens", "chat"):
            raise ValueError(f"OpenAIEngine mode is {mode!r}; use 'tokens' (token-in) or 'chat'")
        self.model, self.mode, self.max_model_len, self.token_in = model, mode, max_model_len, mode == "tokens"
        self.version = f"openai-{openai.__version__}"
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", max_retries=max_retries,
                                         timeout=timeout_s)
        self._errors = (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError)
        self._bad_request = openai.APIStatusError
        self._limit = asyncio.Semaphore(concurrency)

    async def generate(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        async with self._limit:
            try:
                return await (self._tokens(request, sampling) if self.token_in else self._chat(request, sampling))
            except self._errors as exc:  # the client already retried with backoff
                raise EngineError(f"server unreachable or failing after retries: {type(exc).__name__}: {exc}") from exc
            except self._bad_request as exc:
                raise RequestError(f"server refused the request: {exc.status_code} {str(exc)[:500]}") from exc

    def _common(self, request: Request, sampling: SamplingArgs) -> dict[str, Any]:
        return {"model": self.model, "n": request.n, "max_tokens": request.max_tokens, "seed": request.seed,
                "temperature": sampling.temperature, "top_p": sampling.top_p,
                "extra_body": {"return_token_ids": True}}

    async def _tokens(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        resp = (await self.client.completions.create(prompt=request.ids, logprobs=0,
                                                     **self._common(request, sampling))).model_dump()
        return [Sample(list(c.get("token_ids") or []), list((c.get("logprobs") or {}).get("token_logprobs") or []),
                       c["text"], c.get("finish_reason") or "stop", list(request.ids)) for c in resp["choices"]]

    async def _chat(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        from hubgym.schemas.messages import from_openai, to_openai

        kwargs = self._common(request, sampling)
        if request.tools:
            kwargs["tools"] = request.tools
        resp = (await self.client.chat.completions.create(
            messages=[to_openai(m) for m in request.messages], logprobs=True, **kwargs)).model_dump()
        samples = []
        for c in resp["choices"]:
            message = from_openai({**c["message"], "role": "assistant"})
            logprobs = [t["logprob"] for t in ((c.get("logprobs") or {}).get("content") or [])]
            samples.append(Sample(list(c.get("token_ids") or []), logprobs, message["content"] or "",
                                  c.get("finish_reason") or "stop", list(resp.get("prompt_token_ids") or []),
                                  message["tool_calls"]))
        return samples

    def close(self) -> None:
        pass
