"""The chat Message: one Arrow struct used everywhere (task prompts, completions, tool results).

Mirrors an OpenAI chat message, with tool calls flattened to `{id, name, arguments}` where
`arguments` is the JSON string the model wrote (kept verbatim: it may not parse).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

import datasets

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
TOOL_ERROR_PREFIX = "Error: "
"""A tool message whose content starts with this reports a failed call (bad arguments, crash, timeout)."""


class ToolCall(TypedDict):
    id: str
    name: str
    arguments: str  # JSON text as the model wrote it


class Message(TypedDict):
    """One chat message in OpenAI's shape, the same in a task's prompt, a rollout's completion and an engine
    request: `content` None only for an assistant turn that is all tool calls; `tool_call_id` and `name` on a
    tool result; every key present (None when unused) so that Arrow and datasets store one struct type."""

    role: Role
    content: str | None
    tool_calls: list[ToolCall] | None
    tool_call_id: str | None
    name: str | None
    reasoning: NotRequired[str | None]  # assistant replies only: what a reasoning parser split off the answer


TOOL_CALL_FEATURES = {
    "id": datasets.Value("string"),
    "name": datasets.Value("string"),
    "arguments": datasets.Value("string"),
}
MESSAGE_FEATURES = {
    "role": datasets.Value("string"),
    "content": datasets.Value("string"),
    "tool_calls": datasets.List(TOOL_CALL_FEATURES),
    "tool_call_id": datasets.Value("string"),
    "name": datasets.Value("string"),
}
MESSAGE = datasets.Features({"m": MESSAGE_FEATURES}).arrow_schema.field("m").type
"""The Arrow struct type of a Message (derived from the datasets features, so the two never drift)."""
REPLY_FEATURES = {**MESSAGE_FEATURES, "reasoning": datasets.Value("string")}
"""A message of a rollout's completion: a Message plus the reply's `reasoning` (null when none). Task prompts keep
MESSAGE_FEATURES, so task tables are unchanged; rollout shards written before the field read with it null."""
REPLY = datasets.Features({"m": REPLY_FEATURES}).arrow_schema.field("m").type


def message(
    role: Role,
    content: str | None,
    *,
    tool_calls: list[ToolCall] | None = None,
    tool_call_id: str | None = None,
    name: str | None = None,
) -> Message:
    """A Message with every key present (the normalized form stored in Arrow)."""
    return {"role": role, "content": content, "tool_calls": tool_calls, "tool_call_id": tool_call_id, "name": name}


def system(content: str) -> Message:
    return message("system", content)


def user(content: str) -> Message:
    return message("user", content)


def assistant(content: str | None = None, tool_calls: list[ToolCall] | None = None, *,
              reasoning: str | None = None) -> Message:
    """An assistant message; `reasoning` (the key only when given) is what a reasoning parser split off."""
    msg = message("assistant", content, tool_calls=tool_calls)
    return {**msg, "reasoning": reasoning} if reasoning is not None else msg


def tool_result(content: str, tool_call_id: str, name: str) -> Message:
    return message("tool", content, tool_call_id=tool_call_id, name=name)


def tool_call(id: str, name: str, arguments: str) -> ToolCall:
    return {"id": id, "name": name, "arguments": arguments}


def normalize(msg: dict) -> Message:
    """Fill missing keys with None so a loosely written message matches the Arrow struct."""
    out = message(
        msg["role"],
        msg.get("content"),
        tool_calls=([tool_call(c["id"], c["name"], c["arguments"]) for c in msg["tool_calls"]]
                    if msg.get("tool_calls") else None),
        tool_call_id=msg.get("tool_call_id"),
        name=msg.get("name"),
    )
    return {**out, "reasoning": msg["reasoning"]} if msg.get("reasoning") is not None else out


def to_openai(msg: Message) -> dict:
    """The OpenAI chat-completions form (nested `function`, keys only when set)."""
    out: dict = {"role": msg["role"], "content": msg.get("content")}
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in msg["tool_calls"]
        ]
    if msg.get("tool_call_id") is not None:
        out["tool_call_id"] = msg["tool_call_id"]
    if msg.get("name") is not None and msg["role"] == "tool":
        out["name"] = msg["name"]
    return out


def from_openai(msg: dict) -> Message:
    """Inverse of `to_openai`; accepts the dicts the `openai` client returns (`model_dump()`)."""
    calls = [tool_call(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
    return message(msg["role"], msg.get("content"), tool_calls=calls or None,
                   tool_call_id=msg.get("tool_call_id"), name=msg.get("name"))
