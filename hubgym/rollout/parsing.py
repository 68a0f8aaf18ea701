"""Text tool-call parsing for models without native tool calls (Hermes/Qwen `<tool_call>` format).

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

A call whose JSON does not parse is still returned, with its raw text as `arguments`, so the
loop can answer the model with an error instead of dropping the turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from hubgym.schemas.messages import ToolCall, tool_call

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


@dataclass
class ParsedReply:
    content: str  # the reply with tool-call blocks removed
    calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)  # one per call that did not parse


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
            reply.calls.append(tool_call(call_id, name, arguments if isinstance(arguments, str) else json.dumps(arguments)))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            reply.calls.append(tool_call(call_id, "invalid_tool_call", body.strip()))
            reply.parse_errors.append(f"{type(exc).__name__}: {exc}")
    return reply
