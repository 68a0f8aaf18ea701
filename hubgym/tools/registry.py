"""The tool registry: names that interaction specs may list, resolved lazily.

A name maps to a Tool (stateless) or a ToolSet subclass (stateful, one instance per rollout).
Third-party packages add tools through the `hubgym.tools` entry-point group.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from hubgym.errors import ToolNotFoundError
from hubgym.schemas.tasks import Task
from hubgym.tools.base import Tool, Toolbox, ToolSet

ENTRY_POINT_GROUP = "hubgym.tools"

BUILTIN_TOOLS: dict[str, str] = {
    "calculator": "hubgym.tools.calculator:calculator",
    "python": "hubgym.tools.python:python",
    "retail": "hubgym.tools.retail:RetailTools",
}


def tool_names() -> list[str]:
    return list(BUILTIN_TOOLS) + sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def get_tool(name: str) -> Tool | type[ToolSet]:
    """The Tool or ToolSet class registered under `name`."""
    if name in BUILTIN_TOOLS:
        module, _, attr = BUILTIN_TOOLS[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        return ep.load()
    raise ToolNotFoundError(f"no tool named {name!r}; known tools: {', '.join(tool_names())}. "
                            f"Fix the interaction spec's `tools`, or install the package that provides it")


def make_toolbox(names: list[str], task: Task) -> Toolbox:
    """A fresh Toolbox for one rollout of `task`: ToolSets are instantiated with the task."""
    tools: list[Tool] = []
    for name in names:
        entry = get_tool(name)
        tools += [entry] if isinstance(entry, Tool) else entry(task).bound_tools()
    return Toolbox(tools)
