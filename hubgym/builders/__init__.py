"""Builders: TaskBuilder (a datasets GeneratorBasedBuilder), the env registry by name, and one module per built-in
env. What a user types is resolved, and envs are built and pushed, by hubgym.envs.

Names load on first use, so listing the catalog (`hubgym envs`) does not import datasets.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "TaskBuilder": "hubgym.builders.base", "TaskConfig": "hubgym.builders.base", "split_seed": "hubgym.builders.base",
    "build_files": "hubgym.envs.build", "build_tasks": "hubgym.envs.build",
    "make_builder": "hubgym.envs.build",
    "distinct": "hubgym.builders.base",
    "BUILTIN_ENVS": "hubgym.builders.registry", "env_names": "hubgym.builders.registry",
    "resolve_env": "hubgym.builders.registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hubgym.builders' has no attribute {name!r}")
