"""Engines: what turns prompts into sampled tokens, and the one place each is built.

    from hubgym.engines import EngineSettings, make_engine
    engine = make_engine("vllm", "models/policy", max_model_len=4096, settings=EngineSettings(dtype="bfloat16"))

- base: the `Engine` protocol, `SamplingArgs`, `Request`, `Sample`
- settings: `EngineSettings`, checked once, naming the setting; factory: `make_engine`, the one place engines are built
- offline: `VLLMEngine`, vLLM's offline engine in this process with continuous batching
- openai_client: `OpenAIEngine`, any OpenAI-compatible server (tokens, chat, chat_tokens modes)
- server: `VLLMServer`, a `vllm serve` process started and stopped by hubgym
- reaper, vllm_logging, http_json: engine processes that die with their owner, vLLM's log level, the HTTP client

Nothing here imports vLLM, torch or aiohttp until an engine is created.
"""

from __future__ import annotations

from hubgym.files.lazy import lazy_attributes

_EXPORTS: dict[str, str] = {
    "Engine": "hubgym.engines.base", "SamplingArgs": "hubgym.engines.base", "Request": "hubgym.engines.base",
    "Sample": "hubgym.engines.base",
    "EngineSettings": "hubgym.engines.settings", "make_engine": "hubgym.engines.factory",
    "DTYPES": "hubgym.engines.settings", "KINDS": "hubgym.engines.settings",
    "VLLMEngine": "hubgym.engines.offline", "OpenAIEngine": "hubgym.engines.openai_client",
    "VLLMServer": "hubgym.engines.server",
    "EngineError": "hubgym.errors", "RequestError": "hubgym.errors",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
