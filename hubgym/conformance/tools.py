"""The tool checks: every tool an env offers resolves, has a complete OpenAI schema, and works on some call.

A tool resolves in the env's own tools module first (TOOLS_MODULE, shipped with the env), then in the
tool registry. Its schema must describe every parameter (the model reads those descriptions; they come
from the docstring's `Args`). And it must succeed at least once when called with the arguments the env's
golden cases give it (or, when no case calls it, arguments made from its schema): a tool that raises on
every call would only ever hand the model errors.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hubgym.conformance.common import fail, short
from hubgym.errors import ToolNotFoundError, Where
from hubgym.schemas import tool_call

if TYPE_CHECKING:
    from hubgym.conformance.context import Context
    from hubgym.tools.base import Tool

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI-compatible servers accept
CALLS_PER_TOOL = 3  # calls the checker makes of one tool function, at most
_SCHEMA_FIX = "define tools with @hubgym.tool on a typed function with a docstring (or a ToolSet method)"


def check_tool_schemas(ctx: Context) -> None:
    """Every tool the env offers resolves (in the env's own tools module, then the tool registry) and has a valid
    OpenAI function schema that describes each parameter."""
    for name, where in offered(ctx).items():
        entry = resolve(ctx, name, where)
        for fn in functions(entry):
            schema = fn.schema if _is_tool(fn) else fn
            problem = schema_problem(schema)
            if problem:
                fail(f"the schema of tool {name!r} {problem}", _at(where, fn), _SCHEMA_FIX)
            missing = [p for p, spec in schema["function"]["parameters"].get("properties", {}).items()
                       if not (spec.get("description") or "").strip()]
            if missing:
                fail(f"the schema of tool {name!r} ({origin(fn)}) has no description for parameter {missing[0]!r}; "
                     f"most likely the docstring's Args section leaves it out, so the model is told nothing about it",
                     _at(where, fn, missing[0]),
                     f"describe it in the docstring: `Args:` then `    {missing[0]}: what it is, e.g. ...`")


def check_tools_run(ctx: Context) -> None:
    """Each tool function succeeds on at least one call: with the arguments the golden cases call it with, else
    with arguments made from its schema."""
    from hubgym.tools.base import Toolbox

    for name, where in offered(ctx).items():
        entry, task = resolve(ctx, name, where), _task_offering(ctx, name)
        for fn in bound_functions(entry, task):
            golden = golden_calls(ctx, fn.name)[:CALLS_PER_TOOL]
            calls = golden or [(task, schema_arguments(fn.schema))]
            errors = []
            for i, (case_task, args) in enumerate(calls):  # a ToolSet is built from the task its call belongs to
                box = Toolbox([f for f in bound_functions(entry, case_task) if f.name == fn.name])
                outcome = box.call(tool_call(f"check_{i}", fn.name, json.dumps(args)))
                if outcome.error is None:
                    break
                errors.append(f"{outcome.error['type']}: {outcome.error['message']}")
            else:
                given = "its golden cases' arguments" if golden else "arguments made from its schema (no golden " \
                        "case calls it)"
                fail(f"tool {fn.name!r} ({origin(fn)}) failed on every call the checker made with {given} "
                     f"({len(errors)}): {errors[0][:300]}; a tool that always fails only ever hands the model "
                     f"an error", _at(where, fn),
                     "fix the tool; raise only for arguments that are really wrong (the model gets the message), and "
                     "give a golden case that calls it as a model should")


# -- what the checks share ---------------------------------------------------------------------------

def offered(ctx: Context) -> dict[str, Where]:
    """Every tool name the env offers (its TOOLS, then the rows'), with where it is first named."""
    found: dict[str, Where] = {name: ctx.where(field="TOOLS") for name in ctx.builder.TOOLS}
    for config, split, rows in ctx.splits():
        for row in rows:
            for name in row["interaction"]["tools"]:
                found.setdefault(name, ctx.where(config, split, row["id"], "interaction.tools"))
    return found


def resolve(ctx: Context, name: str, where: Where) -> Any:
    """The Tool or ToolSet a name means for this env; a failure names where to define it."""
    from hubgym.tools.registry import get_tool, tool_names

    own = ctx.verifier.tools
    try:
        return get_tool(name, own, ctx.env)
    except ToolNotFoundError:
        mine = f"the env's tools module defines {', '.join(own.tools)}; " if own else ""
        fail(f"tool {name!r} is neither the env's own nor in the tool registry ({mine}registry: "
             f"{', '.join(tool_names())})", where,
             "define it with @hubgym.tool in the env's tools.py and set TOOLS_MODULE = \"tools.py\" on the builder (it "
             "ships with the env); or fix the name; or install a package registering it in the 'hubgym.tools' "
             "entry-point group")
    except Exception as exc:
        fail(f"tool {name!r} failed to import: {type(exc).__name__}: {exc}", where, "fix the tool's module")


def functions(entry: Any) -> list[Any]:
    """The Tool functions of an entry (a ToolSet's methods), or the raw object when it is neither (a bad schema)."""
    from hubgym.tools.base import Tool, ToolSet

    if isinstance(entry, Tool):
        return [entry]
    if isinstance(entry, type) and issubclass(entry, ToolSet):
        return entry.tools() or [{"type": "function", "function": {"name": entry.__name__}}]
    return [{"type": type(entry).__name__}]


def bound_functions(entry: Any, task: dict) -> list[Tool]:
    """The callable Tool functions of an entry: a ToolSet instantiated for `task`, as one rollout would."""
    from hubgym.tools.base import Tool

    return [entry] if isinstance(entry, Tool) else entry(task).bound_tools()


def golden_calls(ctx: Context, function: str) -> list[tuple[dict, dict[str, Any]]]:
    """(the case's task, the JSON arguments) of every call the golden cases make to `function` (those that parse)."""
    out = []
    for case in ctx.golden:
        for message in case.completion or []:
            for call in message.get("tool_calls") or []:
                if call["name"] == function:
                    try:
                        args = json.loads(call["arguments"] or "{}")
                    except ValueError:
                        continue
                    if isinstance(args, dict):
                        out.append((case.task, args))
    return out


def schema_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments that fit a tool schema: each required parameter's default, first enum value, example from its
    description ("e.g. 3.5"), or a plain value of its type."""
    params = schema["function"]["parameters"]
    return {name: _value(spec) for name, spec in params.get("properties", {}).items()
            if name in params.get("required", [])}


def origin(fn: Any) -> str:
    """`tools.py:convert`: the file and function that define a tool."""
    if not _is_tool(fn):
        return "?"
    target = inspect.unwrap(getattr(fn.fn, "__func__", fn.fn))
    try:
        file = Path(inspect.getsourcefile(target) or "?").name
    except TypeError:
        file = "?"
    return f"{file}:{getattr(target, '__qualname__', fn.name)}"


def schema_problem(schema: dict[str, Any]) -> str | None:
    """What is wrong with an OpenAI tool schema, as the end of a sentence; None when it is valid."""
    if schema.get("type") != "function":
        return f"has type {schema.get('type')!r}, not 'function' (it is not a Tool or a ToolSet with tools)"
    fn = schema.get("function") or {}
    if not isinstance(fn.get("name"), str) or not _TOOL_NAME.match(fn["name"]):
        return f"has name {fn.get('name')!r}; tool names are 1-64 letters, digits, '_' or '-'"
    if not isinstance(fn.get("description"), str) or not fn["description"].strip():
        return "has an empty description (the model reads it to decide when to call the tool)"
    params = fn.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        return f"has parameters {short(params)}, not a JSON-schema object"
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as exc:
        return f"is not JSON-serializable ({exc})"
    return None


def _is_tool(value: Any) -> bool:
    from hubgym.tools.base import Tool

    return isinstance(value, Tool)


def _at(where: Where, fn: Any, parameter: str | None = None) -> Where:
    place = origin(fn) + (f"({parameter})" if parameter else "")
    return Where(where.env, where.config, where.split, where.row, place if _is_tool(fn) else where.field)


def _task_offering(ctx: Context, name: str) -> dict:
    """A row that offers the tool (a ToolSet is built from it), else the first golden case's task."""
    for _, _, rows in ctx.splits():
        for row in rows:
            if name in row["interaction"]["tools"]:
                return row
    return ctx.golden[0].task if ctx.golden else {"id": "check", "env": ctx.env, "info": {}, "prompt": [],
                                                  "interaction": {"tools": [name]}}


_EXAMPLE = re.compile(r"e\.g\.,?\s+(\"[^\"]*\"|'[^']*'|[^\s,;)]+)")
_PLAIN = {"string": "a", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}, "null": None}


def _value(spec: dict[str, Any]) -> Any:
    if "default" in spec:
        return spec["default"]
    if spec.get("enum"):
        return spec["enum"][0]
    kind = spec.get("type") or next((s.get("type") for s in spec.get("anyOf", []) if s.get("type") != "null"),
                                    "string")
    example = _EXAMPLE.search(spec.get("description") or "")
    if example is not None:
        text = example.group(1).rstrip(".")
        try:
            value = json.loads(text.replace("'", '"')) if text[0] in "\"'" or kind != "string" else text
            if kind == "string" or isinstance(value, (int, float)) == (kind in ("integer", "number")):
                return value if kind != "integer" or isinstance(value, int) else _PLAIN[kind]
        except ValueError:
            pass
    return _PLAIN.get(kind, "a")
