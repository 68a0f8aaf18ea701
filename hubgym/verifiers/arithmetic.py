"""Verifier for `arithmetic`: exact integer match of the <answer> (or last number).

Its rewards are batch rewards: one call scores a whole batch (a rollout group, a re-score's record
batch), which spares the contract's per-row call and checks of each reward (~7% of a re-score's
reward code, bench/RESULTS.md); every row's value depends on that row alone.
"""

from __future__ import annotations

from hubgym.schemas import Message, Task
from hubgym.verifiers.rewards import answer_in_format, extract_answer, extract_tag, final_text


def parse_answer(task: Task, completion: list[Message]) -> str | None:
    """The answer in the task's format (`answer_found`, `hubgym report`'s no_answer): the <answer> tag when the prompt
    asks for it; else the tag, \\boxed{} or the last number of the final reply. None when there is none."""
    return answer_in_format(task, completion)


def correct(tasks: list[Task], completions: list[list[Message]]) -> list[float]:
    """1.0 for each row whose answer (the <answer> tag, else \\boxed{}, else the last number) equals its
    expression's value."""
    return [_equals(extract_answer(final_text(completion)), task["info"]["answer"])
            for task, completion in zip(tasks, completions)]


def formatted(tasks: list[Task], completions: list[list[Message]]) -> list[float]:
    """1.0 for each row whose reply wraps its answer in <answer></answer> (a metric: weight 0)."""
    return [float(extract_tag(final_text(completion), "answer") is not None) for completion in completions]


def _equals(answer: str | None, gold: str) -> float:
    try:
        return float(answer is not None and float(answer) == float(gold))
    except ValueError:
        return 0.0


BATCH_REWARDS = {correct: 1.0, formatted: 0.0}
REWARD_RANGE = (0.0, 1.0)
