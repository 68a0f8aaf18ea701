"""Verifier for `arithmetic`: exact integer match of the <answer> (or last number)."""

from __future__ import annotations

from hubgym.schemas import Message, Task
from hubgym.verifiers.rewards import answer_in_format, extract_answer, extract_tag, final_text


def parse_answer(task: Task, completion: list[Message]) -> str | None:
    """The answer in the task's format (`answer_found`, `hubgym report`'s no_answer): the <answer> tag when the prompt
    asks for it; else the tag, \\boxed{} or the last number of the final reply. None when there is none."""
    return answer_in_format(task, completion)


def correct(task: Task, completion: list[Message]) -> float:
    """1.0 when the answer (the <answer> tag, else \\boxed{}, else the last number) equals the expression's value."""
    answer = extract_answer(final_text(completion))
    try:
        return float(answer is not None and float(answer) == float(task["info"]["answer"]))
    except ValueError:
        return 0.0


def formatted(task: Task, completion: list[Message]) -> float:
    """1.0 when the reply wraps its answer in <answer></answer> (a metric: weight 0)."""
    return float(extract_tag(final_text(completion), "answer") is not None)


REWARDS = {correct: 1.0, formatted: 0.0}
REWARD_RANGE = (0.0, 1.0)
