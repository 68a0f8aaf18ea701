"""Which builder a local env reference means (a name, versioned id, entry point, folder or .py file), and which
of its configs a reference asks for.

    resolve_env("arithmetic-v1")        # the builder class (the version must match)
    resolve_env("./envs/count_vowels")  # the builder in that folder's builder.py
    known_config(builder, "easy")       # "easy", or an error listing the configs it has
"""

from __future__ import annotations

import os

from hubgym.builders.base import TaskBuilder
from hubgym.builders.registry import builder_by_name, is_registered, load_builder_file
from hubgym.envs.refs import EnvRef, parse_ref
from hubgym.errors import EnvNotFoundError

EnvSpec = str | os.PathLike | EnvRef | type[TaskBuilder]


def resolve_env(spec: EnvSpec) -> type[TaskBuilder]:
    """The builder class of a local env reference (a name, versioned id, entry point, folder or .py file)."""
    if isinstance(spec, type) and issubclass(spec, TaskBuilder):
        return spec
    ref = spec if isinstance(spec, EnvRef) else parse_ref(spec)
    if ref.kind == "hub":
        raise EnvNotFoundError(f"{ref.text!r} is a hub env (org/name): open it with hubgym.envs.open_env or "
                               f"hubgym.load_env, which check its code against a pin")
    if ref.kind == "path":
        return load_builder_file(ref.path / "builder.py" if ref.path.is_dir() else ref.path)
    if not is_registered(ref.name) and os.path.isdir(ref.text):  # a bare word names a registered env first
        return load_builder_file(os.path.join(ref.text, "builder.py"))  # type: ignore[arg-type]
    builder = builder_by_name(ref.name)
    if ref.version is not None and builder.ENV_VERSION != ref.version:
        raise EnvNotFoundError(f"env {ref.name!r} is at version {builder.ENV_VERSION}, not {ref.version}; "
                               f"use {builder.env_id()!r} or install the version you need")
    return builder


def known_config(builder: type[TaskBuilder], config: str | None) -> str:
    """`config`, or the builder's first; an unknown one is an error listing the known ones."""
    known = builder.config_names()
    if config is None:
        return known[0]
    if config not in known:
        raise builder.no_config(config, f"write ENV:CONFIG with one of its configs: {', '.join(known)}")
    return config
