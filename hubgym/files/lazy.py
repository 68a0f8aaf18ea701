"""A package's public names, imported on first use: `import hubgym` stays light (no datasets, torch or vLLM).

    _EXPORTS = {"check_env": "hubgym.conformance.runner", ...}
    __getattr__ = lazy_attributes(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_attributes(package: str, exports: dict[str, str], submodules: tuple[str, ...] = ()) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `exports[name]` and returns its `name`, or the submodule `name`."""
    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
