"""Builders: TaskBuilder (a datasets GeneratorBasedBuilder), the env registry by name, and one module per built-in
env. What a user types is resolved, and envs are built and pushed, by hubgym.envs.

Names load on first use, so listing the catalog (`hubgym envs`) does not import datasets.
"""

from __future__ import annotations

from hubgym.files.lazy import lazy_attributes

_EXPORTS: dict[str, str] = {
    "TaskBuilder": "hubgym.builders.base", "TaskConfig": "hubgym.builders.base", "split_seed": "hubgym.builders.base",
    "distinct": "hubgym.builders.base",
    "BUILTIN_ENVS": "hubgym.builders.registry", "env_names": "hubgym.builders.registry",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
