"""Tools: typed, documented Python functions whose OpenAI tool schema comes from the signature.

    @tool
    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: e.g. "(3 + 4) * 2".
        '''

Stateful tools are methods of a `ToolSet`, built fresh for each rollout from the task row, so
calls in one rollout never leak into another. A `Toolbox` holds the tools one rollout may use
and runs calls: bad JSON, bad arguments, exceptions and timeouts all come back as a tool
message starting with "Error: " (and a RowError), never as a crashed run.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import threading
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import docstring_parser
import pydantic

from hubgym.schemas.messages import TOOL_ERROR_PREFIX, Message, ToolCall, tool_result
from hubgym.schemas.rollouts import RowError
from hubgym.schemas.tasks import Task

MAX_OUTPUT_CHARS = 4000  # tool output beyond this is cut: it goes back into the model's context


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: Callable[..., Any]
    arguments: type[pydantic.BaseModel]  # validates the model's arguments
    timeout_s: float = 10.0

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI tool schema: {"type": "function", "function": {name, description, parameters}}."""
        parameters = self.arguments.model_json_schema()
        parameters.pop("title", None)
        for prop in parameters.get("properties", {}).values():
            prop.pop("title", None)
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": parameters}}


def tool(fn: Callable | None = None, *, name: str | None = None, timeout_s: float = 10.0):
    """Make a Tool from a function (or a ToolSet method): types from hints, text from the docstring."""
    def wrap(f: Callable) -> Tool:
        doc = docstring_parser.parse(inspect.getdoc(f) or "")
        if not doc.short_description:
            raise TypeError(f"tool {f.__name__!r} needs a docstring: the model reads it to decide when to call")
        described = {p.arg_name: p.description for p in doc.params}
        fields: dict[str, Any] = {}
        for param in inspect.signature(f, eval_str=True).parameters.values():
            if param.name == "self":
                continue
            if param.annotation is inspect.Parameter.empty:
                raise TypeError(f"tool {f.__name__!r}: parameter {param.name!r} needs a type hint")
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (param.annotation, pydantic.Field(default, description=described.get(param.name)))
        model = pydantic.create_model(f"{f.__name__}_arguments", __config__=pydantic.ConfigDict(extra="forbid"),
                                      **fields)
        description = "\n\n".join(filter(None, [doc.short_description, doc.long_description]))
        return Tool(name or f.__name__, description, f, model, timeout_s)

    return wrap(fn) if fn is not None else wrap


class ToolSet:
    """Tools that share per-rollout state. Subclass, set NAME, and decorate methods with @tool."""

    NAME: ClassVar[str]

    def __init__(self, task: Task) -> None:
        self.task = task

    @classmethod
    def tools(cls) -> list[Tool]:
        return [v for v in vars(cls).values() if isinstance(v, Tool)]

    def bound_tools(self) -> list[Tool]:
        return [dataclasses.replace(t, fn=t.fn.__get__(self)) for t in self.tools()]


@dataclass
class ToolOutcome:
    message: Message  # the tool message returned to the model
    error: RowError | None  # set when the call failed


class Toolbox:
    """The tools one rollout may call, with their state. Build one per rollout."""

    def __init__(self, tools: list[Tool]):
        self.tools = {t.name: t for t in tools}

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def call(self, call: ToolCall) -> ToolOutcome:
        """Run one call. Never raises: every failure becomes an 'Error: ...' tool message."""
        tool_ = self.tools.get(call["name"])
        if tool_ is None:
            return _failed(call, "UnknownTool", f"no tool named {call['name']!r}; available: {sorted(self.tools)}")
        try:
            raw = json.loads(call["arguments"] or "{}")
            arguments = tool_.arguments.model_validate(raw)
        except json.JSONDecodeError as exc:
            return _failed(call, "InvalidJSON", f"arguments are not valid JSON ({exc.msg} at char {exc.pos})")
        except pydantic.ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return _failed(call, "InvalidArguments", problems)
        return _run_with_timeout(tool_, call, {name: getattr(arguments, name) for name in type(arguments).model_fields})


def _run_with_timeout(tool_: Tool, call: ToolCall, kwargs: dict[str, Any]) -> ToolOutcome:
    """Run in a daemon thread so a hung tool costs its timeout, not the run."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = tool_.fn(**kwargs)
        except Exception as exc:  # a tool crash is data for the model
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name=f"tool-{tool_.name}")
    thread.start()
    thread.join(tool_.timeout_s)
    if thread.is_alive():
        return _failed(call, "ToolTimeout", f"{tool_.name} did not finish within {tool_.timeout_s:g}s")
    if "error" in result:
        exc = result["error"]
        return _failed(call, type(exc).__name__, str(exc))
    text = result["value"] if isinstance(result["value"], str) else json.dumps(result["value"], default=str)
    if len(text) > MAX_OUTPUT_CHARS:
        text = text[:MAX_OUTPUT_CHARS] + f"\n[output cut at {MAX_OUTPUT_CHARS} characters]"
    return ToolOutcome(tool_result(text, call["id"], call["name"]), None)


def _failed(call: ToolCall, kind: str, detail: str) -> ToolOutcome:
    error: RowError = {"boundary": "tool", "type": kind, "message": detail[:1000]}
    text = f"{TOOL_ERROR_PREFIX}{kind}: {detail}"[:MAX_OUTPUT_CHARS]
    return ToolOutcome(tool_result(text, call["id"], call["name"]), error)
