"""Verifier for `retail`: replay the completion's tool calls on the task's database, compare with the goal.

Every assistant tool call is replayed in order through `hubgym.tools.retail.replay`, the same
transitions the rollout's tools ran: a call that failed then (bad JSON or arguments, a broken
store rule) fails here too and changes nothing, and calls to other tools are skipped. The tool
messages in the completion are not read, so a stored rollout re-scores the same anywhere.

Reward: db_match (weight 1) is 1.0 iff the final database equals `info.db` patched with
`info.expected_changes` (the records the goals rewrite, as they must end) -- every
asked change made, nothing else touched (a wrong cancellation costs the whole reward, as in
tau-bench). Metrics (weight 0): goals_done, the fraction of goal orders in their expected
state (partial progress on multi-request tasks), and failed_calls.
"""

from __future__ import annotations

from typing import Any

from hubgym.schemas import Message, Task, ToolCall
from hubgym.tools.retail import replay


def tool_calls(completion: list[Message]) -> list[ToolCall]:
    """The assistant's tool calls, in the order they were made."""
    return [c for m in completion if m["role"] == "assistant" for c in m.get("tool_calls") or []]


def final_db(task: Task, completion: list[Message]) -> tuple[dict[str, Any], int]:
    """(the database after the completion's calls, how many retail calls failed)."""
    return replay(task["info"]["db"], tool_calls(completion))


def expected_db(task: Task) -> dict[str, Any]:
    """`info.db` with the records of `info.expected_changes` ({table: {key: record}}) put in place."""
    db, changes = task["info"]["db"], task["info"]["expected_changes"]
    return {table: {**records, **changes.get(table, {})} for table, records in db.items()}


def db_match(task: Task, completion: list[Message]) -> float:
    """1.0 when the final database is exactly the expected one."""
    return float(final_db(task, completion)[0] == expected_db(task))


def goals_done(task: Task, completion: list[Message]) -> float:
    """Fraction of the goals whose order ends as expected (a metric: weight 0)."""
    final, expected = final_db(task, completion)[0]["orders"], expected_db(task)["orders"]
    goals = task["info"]["goals"]
    return sum(final.get(g["order_id"]) == expected[g["order_id"]] for g in goals) / len(goals) if goals else 1.0


def failed_calls(task: Task, completion: list[Message]) -> float:
    """Retail calls that failed: bad arguments or broken store rules (a metric: weight 0)."""
    return float(final_db(task, completion)[1])


REWARDS = {db_match: 1.0, goals_done: 0.0, failed_calls: 0.0}
REWARD_RANGE = (0.0, 1.0)
