"""An env's own tools: the `@tool` functions and `ToolSet` classes of the tools module an env folder ships.

    # envs/units/tools.py
    @hubgym.tool
    def convert(value: float, from_unit: str, to_unit: str) -> str:
        '''Convert a length between units.

        Args:
            value: the number to convert.
            from_unit: the unit it is in (m, cm, km, in, ft).
            to_unit: the unit wanted.
        '''

    # envs/units/builder.py
    class Units(TaskBuilder):
        TOOLS_MODULE = "tools.py"        # beside the builder, as VERIFIER = "verifier.py"
        TOOLS = ["convert"]

    env_tools = load_tools("tools.py", relative_to=folder, env="units")   # EnvTools(tools={"convert": Tool})

The module travels with the env: `hubgym push` uploads it beside the verifier, its sha256 is in the
manifest and in the env's pin, and a loaded env resolves the names its rows offer here first, then in the
tool registry (hubgym.tools.registry). Like a hub verifier, it must be self-contained: it may import
installed packages, not files next to it.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from hubgym.errors import ToolNotFoundError
from hubgym.files import import_source
from hubgym.tools.base import Tool, ToolSet

ToolEntry = Tool | type[ToolSet]


@dataclass(frozen=True)
class EnvTools:
    """The tools one env module defines, by the name rows offer them under."""

    tools: dict[str, ToolEntry] = field(default_factory=dict)
    module: str = ""  # import name (a generated one for a file)
    path: Path | None = None  # the source file
    sha256: str = ""  # of the bytes that ran

    def __bool__(self) -> bool:
        return bool(self.tools)


NO_TOOLS = EnvTools()


def tools_of(module: ModuleType) -> dict[str, ToolEntry]:
    """Every Tool and ToolSet subclass defined at module level, by name (a ToolSet by its NAME)."""
    found: dict[str, ToolEntry] = {}
    for value in vars(module).values():
        if isinstance(value, Tool):
            found[value.name] = value
        elif isinstance(value, type) and issubclass(value, ToolSet) and value is not ToolSet \
                and value.__module__ == module.__name__:
            name = getattr(value, "NAME", None)
            if not isinstance(name, str) or not name:
                raise ToolNotFoundError(f"ToolSet {value.__name__} in {module.__name__} has no NAME; set "
                                        f"NAME = 'the name rows offer it under'")
            found[name] = value
    return found


def load_tools(ref: str, *, relative_to: Path | None = None, env: str | None = None,
               source: bytes | None = None) -> EnvTools:
    """An env's tools module: a `.py` path (relative to `relative_to`; `source` when its bytes were already read
    and checked) or a dotted module name. A module that defines no tool is an error naming it."""
    if ref.endswith(".py"):
        path = Path(os.path.abspath(relative_to / ref if relative_to and not Path(ref).is_absolute() else ref))
        source = path.read_bytes() if source is None else source
        module = import_source(path, source)
    else:
        module = importlib.import_module(ref)
        path = Path(module.__file__ or "")
        source = path.read_bytes() if path.is_file() else b""
    tools = tools_of(module)
    if not tools:
        raise ToolNotFoundError(f"the tools module {ref} of env {env!r} defines no tool; decorate functions with "
                                f"@hubgym.tool (or define ToolSet subclasses) at module level")
    return EnvTools(tools, module.__name__, path, hashlib.sha256(source).hexdigest())
