"""The rule: stored data never chooses which code runs.

    stored_env_verifier("arithmetic", where)     # the env a stored row names: a registered env only
    stored_env_verifier("../evil", where)        # EnvNotFoundError: nothing imported; says which flag chooses

Two kinds of reference, one rule.

- What the user typed (a command-line argument, a training config, a Python call) may name any env: a
  built-in or installed entry-point name, a versioned id (`arithmetic-v1`), a folder or `.py` file, or a
  hub env `org/name[@revision]` whose code is pinned by sha256 or explicitly trusted (hubgym.envs.open_env).
- What stored data names (a row's `env`, a manifest, a card, `index.json`, `hubgym.json`, a revision
  string) never chooses code. A row's env picks only among verifiers the user chose: built-in and
  entry-point envs by name, `--verifier` modules given on the command line, and pinned or trusted hub
  revisions (hubgym.score.choice holds that choice). Anything else, a path above all, is one error
  that names the row's env value and the flag that would allow it.

This module is the only place a stored env name becomes code.
"""

from __future__ import annotations

from hubgym.builders.registry import builder_by_name, is_registered
from hubgym.envs.refs import ENV_NAME, split_version
from hubgym.errors import StoredEnvError, Where
from hubgym.verifiers.contract import Verifier

STORED_ENV_FLAGS = "--verifier ENV=MODULE (a verifier module you name) or --env-revision ORG/NAME@REVISION (pinned)"


def stored_env_verifier(env: object, where: Where | None = None) -> Verifier:
    """The current verifier of an env that stored data names: a built-in or installed entry-point env only.

    A path, a hub ref or any other value is refused without importing anything; the message names the value
    and the flags that let the user choose a verifier for those rows.
    """
    at = f" [{where}]" if where is not None else ""
    name, version = split_version(env) if isinstance(env, str) else (None, None)
    if name is not None and not ENV_NAME.fullmatch(name):
        name = None
    flags = STORED_ENV_FLAGS.replace("ENV", name or "ENV", 1)
    if name is not None and is_registered(name):
        builder = builder_by_name(name)
        if version is not None and builder.ENV_VERSION != version:
            raise StoredEnvError(f"rows name env {env!r}{at}: env {name!r} is at version {builder.ENV_VERSION}, not "
                                 f"{version}. Or choose a verifier for these rows: {flags}", env=str(env))
        return builder.verifier()
    raise StoredEnvError(f"rows name env {repr(env)[:200]}{at}, which is not a built-in or installed env; stored "
                         f"data never chooses which code runs, so no verifier is loaded for it. Choose one for these "
                         f"rows: {flags}", env=env if isinstance(env, str) else None)
