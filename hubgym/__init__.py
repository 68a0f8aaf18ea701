"""hubgym: RL environments for language models as plain data.

An environment is a `datasets` builder that emits typed task rows plus a pure verifier module
that scores trajectories. `import hubgym` stays light: heavy pieces load on first use.

    import hubgym
    tasks = hubgym.build_tasks("arithmetic", "easy")["test"]
    verifier = hubgym.resolve_env("arithmetic").verifier()
    score = verifier.score(tasks[0], [hubgym.assistant("<answer>7</answer>")])
"""

from __future__ import annotations

from hubgym.files.lazy import lazy_attributes

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # schemas
    "SCHEMA_VERSION": "hubgym.schemas", "Message": "hubgym.schemas", "Task": "hubgym.schemas",
    "Rollout": "hubgym.schemas", "make_task": "hubgym.schemas", "interaction": "hubgym.schemas",
    "system": "hubgym.schemas", "user": "hubgym.schemas", "assistant": "hubgym.schemas",
    "tool_call": "hubgym.schemas", "tool_result": "hubgym.schemas",
    "validate_tasks": "hubgym.schemas", "validate_rollouts": "hubgym.schemas",
    # builders
    "TaskBuilder": "hubgym.builders", "TaskConfig": "hubgym.builders", "env_names": "hubgym.builders",
    "distinct": "hubgym.builders",
    # envs: opening any env, building and pushing it
    "open_env": "hubgym.envs", "OpenedEnv": "hubgym.envs", "resolve_env": "hubgym.envs", "load_env": "hubgym.envs",
    "build_tasks": "hubgym.envs", "build_files": "hubgym.envs", "push_env": "hubgym.envs",
    # verifiers
    "Verifier": "hubgym.verifiers", "Score": "hubgym.verifiers", "load_verifier": "hubgym.verifiers",
    # tools
    "tool": "hubgym.tools", "Tool": "hubgym.tools", "ToolSet": "hubgym.tools", "Toolbox": "hubgym.tools",
    "make_toolbox": "hubgym.tools",
    # conformance
    "check_env": "hubgym.conformance",
    # hub
    "push_rollouts": "hubgym.hub", "open_rollouts": "hubgym.hub",
    "iter_rollouts": "hubgym.hub",
    # rollout
    "RolloutConfig": "hubgym.rollout", "run_rollouts": "hubgym.rollout",
    # score
    "rescore": "hubgym.score", "RescoreResult": "hubgym.score",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
