"""Reading a model's reply: its reasoning, its free text and its tool calls.

The default tool format is Hermes/Qwen text, parsed here without vLLM:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

A call whose JSON does not parse is still returned, with its raw text as `arguments`, so the
loop can answer the model with an error instead of dropping the turn. Other formats are vLLM's
own parsers, picked by the names `vllm serve --tool-call-parser` / `--reasoning-parser` take
(`ReplyParser`), so a reply reads the same here as it would from a vLLM server. Call ids are
always `<id_prefix>-<n>` (vLLM's are random), so a replay parses a stored reply to the same ids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from hubgym.errors import ChatFormatError
from hubgym.schemas.messages import ToolCall, tool_call

HERMES = "hermes"  # the default tool format: parsed by `parse_tool_calls`, no vLLM needed
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


@dataclass
class ParsedReply:
    content: str  # the reply with tool-call blocks (and reasoning) removed
    calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)  # one per call that did not parse
    reasoning: str | None = None  # what a reasoning parser split off (None: no reasoning parser, or none found)


def parse_tool_calls(text: str, id_prefix: str) -> ParsedReply:
    """Split a reply into free text and tool calls; ids are `<id_prefix>-<n>` (stable for replay)."""
    reply = ParsedReply(content=_CALL.sub("", text).strip())
    for n, body in enumerate(_CALL.findall(text)):
        call_id = f"{id_prefix}-{n}"
        try:
            obj = json.loads(body.strip())
            name, arguments = obj["name"], obj.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError("name must be a string")
            text_arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
            reply.calls.append(tool_call(call_id, name, text_arguments))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            reply.calls.append(tool_call(call_id, "invalid_tool_call", body.strip()))
            reply.parse_errors.append(f"{type(exc).__name__}: {exc}")
    return reply


def tool_parser_names() -> list[str]:
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.list_registered()


def reasoning_parser_names() -> list[str]:
    from vllm.reasoning import ReasoningParserManager

    return ReasoningParserManager.list_registered()


def check_parser_names(tool_parser: str, reasoning_parser: str | None, *, tool_setting: str = "tool_parser",
                       reasoning_setting: str = "reasoning_parser") -> None:
    """ChatFormatError (one line, naming the setting and the known names) for a parser vLLM does not know."""
    if tool_parser != HERMES and tool_parser not in (known := tool_parser_names()):
        raise ChatFormatError(f"{tool_setting} {tool_parser!r} is not one of vLLM's tool parsers; use one of: "
                         f"{', '.join(known)}", setting=tool_setting)
    if reasoning_parser is not None and reasoning_parser not in (known := reasoning_parser_names()):
        raise ChatFormatError(f"{reasoning_setting} {reasoning_parser!r} is not one of vLLM's reasoning parsers; "
                              f"use one of: {', '.join(known)} (or none)", setting=reasoning_setting)


class ReplyParser:
    """A reply's reasoning, free text and tool calls, read as vLLM's server reads them.

    `tool_parser` "hermes" is `parse_tool_calls`; any other name is vLLM's `ToolParserManager` parser
    of that name. `reasoning_parser` (None: the reply has no reasoning part) is vLLM's
    `ReasoningParserManager` parser: what it splits off goes to `reasoning`, the rest is the answer.
    A parser that does not fit the tokenizer (vLLM looks up its special tokens) fails here, at start.
    """

    def __init__(self, tokenizer: Any, tool_parser: str = HERMES, reasoning_parser: str | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None):
        self.tokenizer, self.tool_parser, self.reasoning_parser = tokenizer, tool_parser, reasoning_parser
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if tool_parser == HERMES and reasoning_parser is None:
            return
        check_parser_names(tool_parser, reasoning_parser)
        self._tool_cls = None if tool_parser == HERMES else _tool_parser_class(tool_parser)
        self._reasoning = None
        if reasoning_parser is not None:
            from vllm.reasoning import ReasoningParserManager

            cls = ReasoningParserManager.get_reasoning_parser(reasoning_parser)
            self._reasoning = _fitted(cls, tokenizer, f"reasoning_parser {reasoning_parser!r}",
                                      chat_template_kwargs=self.chat_template_kwargs)
        if self._tool_cls is not None:
            _fitted(self._tool_cls, tokenizer, f"tool_parser {tool_parser!r}")

    @property
    def default(self) -> bool:
        return self.tool_parser == HERMES and self.reasoning_parser is None

    def parse(self, text: str, id_prefix: str, tools: list[dict] | None) -> ParsedReply:
        """The reply split into reasoning, answer and (when tools are offered) tool calls.

        Without tool calls the answer is the text as sampled (minus any reasoning); with them, the free text
        the tool parser leaves. Ids are `<id_prefix>-<n>`."""
        reasoning, answer = (None, text) if self.reasoning_parser is None else self._split_reasoning(text, tools)
        if not tools:
            return ParsedReply(answer, reasoning=reasoning)
        parsed = parse_tool_calls(answer, id_prefix) if self.tool_parser == HERMES else self._vllm_calls(
            answer, id_prefix, tools)
        parsed.content = parsed.content if parsed.calls else answer
        parsed.reasoning = reasoning
        return parsed

    def _request(self, tools: list[dict] | None) -> Any:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest(messages=[{"role": "user", "content": ""}], model="hubgym", tools=tools or None,
                                     chat_template_kwargs=self.chat_template_kwargs or None)

    def _split_reasoning(self, text: str, tools: list[dict] | None) -> tuple[str | None, str]:
        reasoning, content = self._reasoning.extract_reasoning(text, self._request(tools))
        return reasoning, content or ""

    def _vllm_calls(self, text: str, id_prefix: str, tools: list[dict]) -> ParsedReply:
        request = self._request(tools)
        try:  # a fresh parser per reply, as the server makes one per request: vLLM's parsers keep state
            info = self._tool_cls(self.tokenizer, request.tools).extract_tool_calls(text, request)
        except Exception as exc:  # a parser that fails on a reply is a parse error of that reply, not a crash
            return ParsedReply(text, parse_errors=[f"{type(exc).__name__}: {exc}"])
        if not info.tools_called:
            return ParsedReply(text)
        calls = [tool_call(f"{id_prefix}-{n}", c.function.name, c.function.arguments or "{}")
                 for n, c in enumerate(info.tool_calls)]
        return ParsedReply((info.content or "").strip(), calls)


def _tool_parser_class(name: str) -> type:
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.get_tool_parser(name)


def _fitted(cls: type, tokenizer: Any, what: str, **kwargs: Any) -> Any:
    """An instance of a vLLM parser for this tokenizer; ChatFormatError in one line when the two do not fit."""
    try:
        return cls(tokenizer, **kwargs)
    except Exception as exc:  # vLLM raises RuntimeError/ValueError when the tokenizer lacks the parser's tokens
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ChatFormatError(f"{what} does not fit this model's tokenizer ({detail}); pick the parser made for the "
                         f"model (the name its `vllm serve` command uses)", setting=what.split()[0]) from None
