"""Authoring: making an env folder to start from, by hand (`hubgym init`: scaffold) or from a dataset's columns
(`hubgym wrap`: spec, source_checks, wrap), from the templates beside them.

    from hubgym.authoring import scaffold_env, WrapSpec, wrap_dataset
    scaffold_env("count_vowels", "envs", kind="tool_use")        # envs/count_vowels/ passes `hubgym check` as made

Names load on first use: `hubgym init` does not import datasets.
"""

from __future__ import annotations

from hubgym.files.lazy import lazy_attributes

_EXPORTS: dict[str, str] = {
    "scaffold_env": "hubgym.authoring.scaffold", "validate_env_name": "hubgym.authoring.scaffold",
    "WrapSpec": "hubgym.authoring.spec", "wrap_dataset": "hubgym.authoring.wrap",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
