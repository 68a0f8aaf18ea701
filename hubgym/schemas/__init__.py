"""Wire data: Arrow schemas, datasets features and pandera checks for Message, Task and Rollout rows."""

from hubgym.schemas.messages import (
    MESSAGE, ROLES, Message, ToolCall, assistant, from_openai, message, normalize, system, to_openai, tool_call,
    tool_result, user,
)
from hubgym.schemas.rollouts import ROLLOUT_FEATURES, ROLLOUT_SCHEMA, Rollout, RowError
from hubgym.schemas.tables import rollouts_to_table, tasks_to_table
from hubgym.schemas.tasks import (
    KINDS, TASK_FEATURES, TASK_SCHEMA, Interaction, Task, ToolReward, canonical_json, interaction, make_task, task_id,
)
from hubgym.schemas.validate import validate_rollouts, validate_tasks
from hubgym.schemas.version import SCHEMA_VERSION

__all__ = [
    "KINDS", "MESSAGE", "ROLES", "ROLLOUT_FEATURES", "ROLLOUT_SCHEMA", "SCHEMA_VERSION", "TASK_FEATURES",
    "TASK_SCHEMA", "Interaction", "Message", "Rollout", "RowError", "Task", "ToolCall", "ToolReward", "assistant",
    "canonical_json", "from_openai", "interaction", "make_task", "message", "normalize", "rollouts_to_table",
    "system", "task_id", "tasks_to_table", "to_openai", "tool_call", "tool_result", "user", "validate_rollouts",
    "validate_tasks",
]
