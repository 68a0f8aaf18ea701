"""Verifier for `arithmetic`: exact integer match of the answer, read the way the prompt asks for it.

A prompt that asks "Reply with just the number." (the `sums` config) is answered by a reply that is the number
alone, or that ends with one final "... = N" (an equation it worked out): a number elsewhere in a rambling reply
states nothing. The other configs (which ask for <answer></answer>) take the tag, then \\boxed{}, then the last
number, as v1 did; the weight-0 `formatted` metric says whether the tag was there.

Its rewards are batch rewards: one call scores a whole batch (a rollout group, a re-score's record
batch), which spares the contract's per-row call and checks of each reward (~7% of a re-score's
reward code, bench/RESULTS.md); every row's value depends on that row alone.
"""

from __future__ import annotations

import re

from hubgym.schemas import Message, Task
from hubgym.verifiers.rewards import answer_in_format, extract_answer, extract_tag, final_text

JUST_THE_NUMBER = "Reply with just the number."  # what the `sums` prompts ask
_NUMBER = r"-?\d+(?:\.\d+)?"
_STATED = re.compile(rf"\s*(?:(?P<alone>{_NUMBER})|[^=\n]*=\s*(?P<equation>{_NUMBER}))\s*\.?\s*", re.ASCII)


def parse_answer(task: Task, completion: list[Message]) -> str | None:
    """The answer in the task's format (`answer_found`, `hubgym report`'s no_answer): the <answer> tag when the prompt
    asks for it; the number alone or a final "... = N" when it asks for just the number; else the tag, \\boxed{} or
    the last number of the final reply. None when there is none."""
    text = final_text(completion)
    if _asks_for_the_number(task):
        return stated_number(text)
    return answer_in_format(task, completion)


def stated_number(text: str) -> str | None:
    """N when the reply is the number N alone, or its last line is one equation ending in "= N" (a full stop after
    either is fine); None for anything else: a number in passing is no answer."""
    lines = text.strip().splitlines()
    if not lines:
        return None
    found = _STATED.fullmatch(lines[-1]) if len(lines) > 1 else _STATED.fullmatch(text)
    if found is None or (len(lines) > 1 and found["equation"] is None):
        return None
    return found["alone"] or found["equation"]


def correct(tasks: list[Task], completions: list[list[Message]]) -> list[float]:
    """1.0 for each row whose answer equals its expression's value: for the `sums` prompts the number it states
    (stated_number); for the others, as in v1, the <answer> tag, else \\boxed{}, else the last number."""
    return [_equals(_answer(task, completion), task["info"]["answer"]) for task, completion in zip(tasks, completions)]


def _answer(task: Task, completion: list[Message]) -> str | None:
    text = final_text(completion)
    return stated_number(text) if _asks_for_the_number(task) else extract_answer(text)


def _asks_for_the_number(task: Task) -> bool:
    return any(JUST_THE_NUMBER in (m.get("content") or "") for m in task.get("prompt") or [])


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
