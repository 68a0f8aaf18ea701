"""Open any env the user names: one function, one record (hubgym.envs.OpenedEnv), every kind of env.

    open_env("arithmetic:easy")                              # a built-in (or family, or entry-point) env
    open_env("arithmetic-v1")                                # a versioned id: the version must match
    open_env("./envs/count_vowels")                          # a folder holding builder.py (or the .py file)
    open_env("org/arith@3f1c2e9:easy", pin="sha256:...")     # a hub revision, its code pinned (or trust=True)
    load_env("org/arith@3f1c2e9", pin="sha256:...", split="test").tasks   # ... with its tasks as a Dataset

Opening generates no row and reads no task data: it resolves the builder (or the hub revision's manifest
and code), picks the config, and loads the verifier with the env's own tools. Rows are read through the
record (OpenedEnv.rows / take / dataset). rollout, score, replay, train, mixtures, stats and the CLI open
envs only here; stored data is never a reference (hubgym.envs.stored).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hubgym.builders.base import TaskBuilder
from hubgym.builders.registry import builder_by_name, load_builder_file
from hubgym.envs.opened import OpenedEnv
from hubgym.envs.pins import parse_pins
from hubgym.envs.refs import EnvRef, parse_ref
from hubgym.errors import EnvContractError, EnvNotFoundError, Where

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
    from hubgym.builders.registry import is_registered

    if not is_registered(ref.name) and os.path.isdir(ref.text):  # a bare word names a registered env first
        return load_builder_file(os.path.join(ref.text, "builder.py"))  # type: ignore[arg-type]
    builder = builder_by_name(ref.name)
    if ref.version is not None and builder.ENV_VERSION != ref.version:
        raise EnvNotFoundError(f"env {ref.name!r} is at version {builder.ENV_VERSION}, not {ref.version}; "
                               f"use {builder.env_id()!r} or install the version you need")
    return builder


def open_env(spec: EnvSpec, config: str | None = None, *, hub: Any = None, trust: bool = False,
             pin: str | None = None, pins: Mapping[str, str] | None = None) -> OpenedEnv:
    """Open one env (see the module docstring). `config` overrides a `:CONFIG` in the spec; a hub env's code runs
    only when its sha256 equals `pin` (or `pins[repo]`, the parsed --pin options), or with `trust`."""
    if isinstance(spec, type) and issubclass(spec, TaskBuilder):
        ref = EnvRef(spec.ENV, "name", config, name=spec.ENV)
    else:
        ref = spec.with_config(config or spec.config) if isinstance(spec, EnvRef) else parse_ref(spec, config)
    if ref.kind == "hub":
        from hubgym.envs.hubenv import open_hub_env

        return open_hub_env(ref, trust=trust, pin=pin or parse_pins(dict(pins or {})).get(ref.repo), hub=hub)
    builder = resolve_env(spec if isinstance(spec, type) else ref)
    return OpenedEnv(builder.ENV, known_config(builder, ref.config), builder.verifier(), ref, builder=builder)


def load_env(spec: EnvSpec, *, trust: bool = False, pin: str | None = None, streaming: bool = False,
             config: str | None = None, split: str | None = None, hub: Any = None) -> OpenedEnv:
    """Open an env and read its tasks as `datasets.load_dataset` would (`env.tasks`: a Dataset, a DatasetDict
    without `split`, Iterable ones with `streaming`): a hub revision's files, or a local env built now.

    A hub env's code runs only if its sha256 equals `pin` ("sha256:<hex>") or with `trust=True`; otherwise
    VerifierNotTrustedError says what its sha256 is and how to pin it, and no task data is read."""
    opened = open_env(spec, config, hub=hub, trust=trust, pin=pin)
    opened.tasks = opened.dataset(split, streaming=streaming)
    return opened


def known_config(builder: type[TaskBuilder], config: str | None) -> str:
    """`config`, or the builder's first; an unknown one is an error listing the known ones."""
    known = builder.config_names()
    if config is None:
        return known[0]
    if config not in known:
        raise EnvContractError(f"env {builder.ENV!r} has no config {config!r}", Where(env=builder.ENV, config=config),
                               f"write ENV:CONFIG with one of its configs: {', '.join(known)}")
    return config
