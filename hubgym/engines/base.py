"""What every engine is: the `Engine` protocol, the sampling arguments, one request and its samples.

Two engines implement it (hubgym.engines.offline.VLLMEngine, hubgym.engines.openai_client.OpenAIEngine);
`make_engine` (hubgym.engines.settings) is the one place either is built.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from hubgym.errors import SettingError
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
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise SettingError(f"sampling max_tokens={self.max_tokens!r} must be a whole number >= 1, the tokens a "
                               f"turn may sample, e.g. max_tokens=128", setting="max_tokens")

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
    """Turns a prompt into `n` sampled continuations with token ids and logprobs, asynchronously: the rollout loop
    awaits many `generate` calls at once, and the engine batches them (vLLM's continuous batching, or a server's).
    `token_in` engines take the prompt as `Request.ids`, rendered by hubgym's chat template; the others render
    `Request.messages` themselves (a server's chat endpoint). `close` frees the engine's processes and memory."""

    name: str
    version: str
    model: str
    max_model_len: int
    token_in: bool  # True: the engine consumes Request.ids; False: it renders Request.messages itself

    async def generate(self, request: Request, sampling: SamplingArgs) -> list[Sample]: ...

    def close(self) -> None: ...
