"""The env layer: what an env reference means, and the one way every caller opens an env and reads its rows.

    from hubgym.envs import open_env, parse_ref, parse_pins
    env = open_env("org/arith@3f1c2e9:easy", pins=parse_pins(["org/arith=sha256:9f2c..."]))
    env.take("test", 8), env.verifier, env.provenance()

- refs: the one env-name rule (ENV_NAME_RULE) and the one parser of references (names, versioned ids,
  paths, `org/name@revision`, each with `:CONFIG`);
- pins: the one parser of `--pin` (a hub env's code sha256);
- open, resolve: `open_env` / `load_env`, returning one record, OpenedEnv, for every kind of env;
  `resolve_env`, a local reference's builder;
- opened: that record, and the one data path of task rows (builder-generated or streamed from a hub);
- hubenv: a hub revision's manifest, code (pinned or trusted) and task files;
- stored: the rule that stored data never chooses code (`stored_env_verifier`);
- build, push: an env's splits as files, and as a hub repo;
- catalog: what every known env is, listed without building any.

Names load on first use: listing envs must not import datasets.
"""

from __future__ import annotations

from hubgym.files.lazy import lazy_attributes

_EXPORTS: dict[str, str] = {
    "ENV_NAME": "hubgym.envs.refs", "ENV_NAME_RULE": "hubgym.envs.refs", "EnvRef": "hubgym.envs.refs",
    "check_env_name": "hubgym.envs.refs", "env_name_problem": "hubgym.envs.refs", "parse_ref": "hubgym.envs.refs",
    "split_version": "hubgym.envs.refs",
    "PIN_HELP": "hubgym.envs.pins", "parse_pins": "hubgym.envs.pins",
    "OpenedEnv": "hubgym.envs.opened", "builder_rows": "hubgym.envs.opened",
    "load_env": "hubgym.envs.open", "open_env": "hubgym.envs.open",
    "known_config": "hubgym.envs.resolve", "resolve_env": "hubgym.envs.resolve",
    "stored_env_verifier": "hubgym.envs.stored",
    "build_files": "hubgym.envs.build", "build_tasks": "hubgym.envs.build", "make_builder": "hubgym.envs.build",
    "PushResult": "hubgym.envs.push", "push_env": "hubgym.envs.push",
    "EnvEntry": "hubgym.envs.catalog", "catalog": "hubgym.envs.catalog",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
