"""The name verifiers 0.4 imports a hubgym env by: `vf-eval hubgym_verifiers --env.taskset.env ENV[:CONFIG] ...`.

verifiers resolves a taskset id to a top-level module exporting its Taskset (and Env) classes in `__all__`; the
classes live in `hubgym.integrations.verifiers_env`.
"""

from hubgym.integrations.verifiers_env import (
    HubgymData,
    HubgymEnv,
    HubgymEnvConfig,
    HubgymTask,
    HubgymTaskset,
    HubgymTasksetConfig,
)

__all__ = ["HubgymData", "HubgymEnv", "HubgymEnvConfig", "HubgymTask", "HubgymTaskset", "HubgymTasksetConfig"]
