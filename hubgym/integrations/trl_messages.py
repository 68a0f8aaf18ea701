"""Messages and task rows between TRL's form and hubgym's: what the env shapes (trl.py) and the recorder
(trl_record.py, trl_rows.py) both read, below both so neither imports the other back.

    from_trl_completion(completion)      # TRL's completion (parsed tool calls, tool results) as hubgym messages
    played_through_act(task)             # a multi_turn task as TRL plays it: `act` among its tools
"""

from __future__ import annotations

import json
from typing import Any

from hubgym.schemas.messages import Message, assistant, message, tool_call, tool_result
from hubgym.schemas.tasks import Task
from hubgym.verifiers.act import ACT_TOOL

TASK_COLUMN = "hubgym_task"
INSTALL = "pip install 'hubgym[trl]'"


def trl_message(m: Message) -> dict[str, Any]:
    """A prompt message as TRL's conversational datasets hold it (role and content)."""
    return {"role": m["role"], "content": m.get("content") or ""}


def from_trl_completion(completion: list[dict[str, Any]] | str) -> list[Message]:
    """TRL's completion (assistant turns whose `tool_calls` carry parsed argument dicts, and `tool` results) as
    hubgym messages; tool calls get the ids hubgym's loop gives them (`call-<turn>-<n>`), results follow in order."""
    if isinstance(completion, str):
        return [assistant(completion)]
    out: list[Message] = []
    pending: list[str] = []  # call ids waiting for their results, oldest first
    turn = 0
    for m in completion:
        if m["role"] == "assistant":
            calls = [tool_call(f"call-{turn}-{n}", c["function"]["name"], _arguments_text(c["function"]))
                     for n, c in enumerate(m.get("tool_calls") or [])]
            out.append(assistant(_text(m.get("content")), calls or None))
            pending = [c["id"] for c in calls]
            turn += 1
        elif m["role"] == "tool":
            call_id = pending.pop(0) if pending else f"call-{turn}-orphan"
            out.append(tool_result(_text(m.get("content")), call_id, m.get("name") or ""))
        else:
            out.append(message(m["role"], _text(m.get("content"))))
    return out


def _arguments_text(function: dict[str, Any]) -> str:
    args = function.get("arguments")
    return args if isinstance(args, str) else json.dumps(args if args is not None else {})


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))  # content parts: text only


def played_through_act(task: Task) -> Task:
    """The task as TRL plays it: a multi_turn task offers `act` besides its own tools (what scoring, replay and the
    stored rows read; hubgym.verifiers.act)."""
    spec = task["interaction"]
    if spec["kind"] != "multi_turn" or ACT_TOOL in spec["tools"]:
        return task
    return {**task, "interaction": {**spec, "tools": [*spec["tools"], ACT_TOOL]}}
