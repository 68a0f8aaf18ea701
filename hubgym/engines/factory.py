"""`make_engine`: the one place an engine is built, for `hubgym rollout`, `hubgym eval`, Ray workers and the trainer.

    engine = make_engine("vllm", "models/policy", max_model_len=4096, seed=0, settings=EngineSettings(dtype="bfloat16"))
    engine = make_engine("openai", "Qwen/Qwen3-4B", base_url="http://127.0.0.1:8000/v1", mode="chat")
"""

from __future__ import annotations

from typing import Any

from hubgym.engines.base import Engine
from hubgym.engines.settings import KINDS, EngineSettings
from hubgym.errors import EngineError


def make_engine(kind: str, model: str, *, max_model_len: int | None = 1024, seed: int = 0,
                settings: EngineSettings = EngineSettings(), base_url: str | None = None, mode: str = "tokens",
                **vllm_args: Any) -> Engine:
    """An engine of `kind` ("vllm" or "openai") serving `model`. vllm: the offline engine in this process, with
    `settings` and any further vLLM engine arguments (`vllm_args`); openai: a client of the server at `base_url`
    in `mode` (tokens, chat, chat_tokens), whose own settings are the server's."""
    if kind == "vllm":
        from hubgym.engines.offline import VLLMEngine

        return VLLMEngine(model, max_model_len=max_model_len, seed=seed, settings=settings, **vllm_args)
    if kind == "openai":
        from hubgym.engines.openai_client import OpenAIEngine

        if not base_url:
            raise EngineError("engine 'openai' needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        settings.check_for(kind)
        return OpenAIEngine(model, base_url, mode=mode, max_model_len=max_model_len)
    raise EngineError(f"engine is {kind!r}; use one of {', '.join(KINDS)}")
