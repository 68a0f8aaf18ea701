"""`OpenAIEngine`: any OpenAI-compatible server (a `vllm` server in production, hosted APIs for evaluation) over
HTTP (aiohttp, `http_json`), in `tokens` mode (token-in `/v1/completions`, text tool-call parsing), `chat` mode
(`/v1/chat/completions`, the server's template and tool parser) or `chat_tokens` mode (token-in
`/v1/chat/completions`, the server's tool parser).

aiohttp is imported when the engine is created, never by `import hubgym`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from hubgym.engines.base import Request, Sample, SamplingArgs
from hubgym.errors import EngineError, RequestError
from hubgym.models.refs import FALLBACK_CONTEXT

MODES = ("tokens", "chat", "chat_tokens")  # token-in completions, the server's chat template, both

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
    MODES = MODES

    def __init__(self, model: str, base_url: str, *, mode: str = "tokens", api_key: str | None = None,
                 max_model_len: int | None = None, max_retries: int = 4, timeout_s: float = 120.0,
                 concurrency: int = 256,
                 extra_body: dict[str, Any] | None = None, return_token_ids: bool = True):
        import aiohttp  # noqa: F401 (the HTTP client: refused here, not at the first request, when missing)

        if mode not in self.MODES:
            raise ValueError(f"OpenAIEngine mode is {mode!r}; use one of {self.MODES}")
        if mode != "chat" and not return_token_ids:
            raise ValueError(f"OpenAIEngine mode {mode!r} is token-in and needs return_token_ids=True; "
                             f"use mode 'chat' for servers without token ids")
        self.model, self.base_url, self.mode = model, base_url, mode
        self.max_model_len = max_model_len or FALLBACK_CONTEXT  # None: a served model's context as runs assume it
        self.token_in = mode in ("tokens", "chat_tokens")
        self.version = f"openai-{_openai_version()}"
        self.max_retries, self.timeout_s, self.concurrency = max_retries, timeout_s, concurrency
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # vLLM accepts any key
        self.extra_body, self.return_token_ids = dict(extra_body or {}), return_token_ids
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _bind(self) -> None:
        """One client and semaphore per event loop: each `run_rollouts` call runs its own loop. The client's
        connections are closed when that loop ends (`_close_at_loop_end`)."""
        from hubgym.engines.http_json import JSONClient

        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._limit = loop, asyncio.Semaphore(self.concurrency)
            self.client = JSONClient(self.base_url, api_key=self.api_key, max_retries=self.max_retries,
                                     timeout_s=self.timeout_s, connections=self.concurrency)
            self._closer = _close_at_loop_end(self.client)
            await self._closer.__anext__()

    async def generate(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        from hubgym.engines.http_json import ServerRefused, ServerUnavailable

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
