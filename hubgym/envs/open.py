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

from collections.abc import Mapping
from typing import Any

from hubgym.builders.base import TaskBuilder
from hubgym.envs.build import build_tasks
from hubgym.envs.opened import OpenedEnv, builder_rows
from hubgym.envs.pins import parse_pins
from hubgym.envs.refs import EnvRef, parse_ref
from hubgym.envs.resolve import EnvSpec, known_config, resolve_env


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
    config = known_config(builder, ref.config)
    return OpenedEnv(builder.ENV, config, builder.verifier(), ref, builder=builder, read=_built(builder, config))


def load_env(spec: EnvSpec, *, trust: bool = False, pin: str | None = None, streaming: bool = False,
             config: str | None = None, split: str | None = None, hub: Any = None) -> OpenedEnv:
    """Open an env and read its tasks as `datasets.load_dataset` would (`env.tasks`: a Dataset, a DatasetDict
    without `split`, Iterable ones with `streaming`): a hub revision's files, or a local env built now.

    A hub env's code runs only if its sha256 equals `pin` ("sha256:<hex>") or with `trust=True`; otherwise
    VerifierNotTrustedError says what its sha256 is and how to pin it, and no task data is read."""
    opened = open_env(spec, config, hub=hub, trust=trust, pin=pin)
    opened.tasks = opened.dataset(split, streaming=streaming)
    return opened


def _built(builder: type[TaskBuilder], config: str):
    """How a local env reads whole splits: built now, into a fresh cache (an unknown split names the known ones)."""
    def read(split: str | None, streaming: bool) -> Any:
        built = build_tasks(builder, config)
        if split is not None and split not in built:
            builder_rows(builder, config, split)  # raises, naming the splits
        return built if split is None else built[split]

    return read
