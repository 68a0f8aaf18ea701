"""The tool registry: names that interaction specs may list, resolved lazily.

A name maps to a Tool (stateless) or a ToolSet subclass (stateful, one instance per rollout). A row's tool
names are looked up in its env's own tools first (the tools module the env ships, hubgym.tools.modules),
then among the built-ins, then in the `hubgym.tools` entry-point group that installed packages fill.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from hubgym.errors import ToolNotFoundError
from hubgym.schemas.tasks import Task
from hubgym.tools.base import Tool, Toolbox, ToolSet
from hubgym.tools.modules import NO_TOOLS, EnvTools

ENTRY_POINT_GROUP = "hubgym.tools"

BUILTIN_TOOLS: dict[str, str] = {
    "calculator": "hubgym.tools.calculator:calculator",
    "python": "hubgym.tools.python:python",
    "retail": "hubgym.tools.retail:RetailTools",
}


def tool_names() -> list[str]:
    return list(BUILTIN_TOOLS) + sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def get_tool(name: str, own: EnvTools = NO_TOOLS, env: str | None = None) -> Tool | type[ToolSet]:
    """The Tool or ToolSet class a row's tool name means: the env's own (`own`) first, then the registry."""
    if name in own.tools:
        return own.tools[name]
    if name in BUILTIN_TOOLS:
        module, _, attr = BUILTIN_TOOLS[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        return ep.load()
    ours = f"env {env!r}'s tools module ({', '.join(own.tools) or 'none'}), " if own or env else ""
    raise ToolNotFoundError(f"no tool named {name!r} in {ours}hubgym's built-in tools or the installed "
                            f"'{ENTRY_POINT_GROUP}' entry points (known: {', '.join(tool_names())}). An env ships "
                            f"its own tools in its folder (tools.py, named by the builder's TOOLS_MODULE; `hubgym "
                            f"push` uploads it); a package can register one in the '{ENTRY_POINT_GROUP}' "
                            f"entry-point group")


def make_toolbox(names: list[str], task: Task, own: EnvTools = NO_TOOLS) -> Toolbox:
    """A fresh Toolbox for one rollout of `task`: ToolSets are instantiated with the task; `own` holds the tools
    of the task's env (looked up first)."""
    tools: list[Tool] = []
    for name in names:
        entry = get_tool(name, own, task.get("env"))
        tools += [entry] if isinstance(entry, Tool) else entry(task).bound_tools()
    return Toolbox(tools)
