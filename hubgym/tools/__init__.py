"""Tools: typed Python functions -> OpenAI tool schemas; per-rollout toolboxes; the sandbox; built-in tools."""

from hubgym.tools.base import Tool, Toolbox, ToolOutcome, ToolSet, tool
from hubgym.tools.modules import EnvTools, load_tools
from hubgym.tools.registry import BUILTIN_TOOLS, get_tool, make_toolbox, tool_names

__all__ = ["BUILTIN_TOOLS", "EnvTools", "Tool", "ToolOutcome", "ToolSet", "Toolbox", "get_tool", "load_tools",
           "make_toolbox", "tool", "tool_names"]
