"""Verifier for `reverse_text`: edit-distance similarity between the answer and the reversed text.

The answer is the last <reversed>...</reversed> block of the final assistant turn, or the whole
turn (stripped) when it has no tag. The reward is continuous, so a near miss still carries
signal: one wrong character in eight scores 0.875, an empty reply 0.0.
"""

from __future__ import annotations

from hubgym.schemas import Message, Task
from hubgym.verifiers.rewards import extract_tag, final_text, similarity

TAG = "reversed"


def answer_of(completion: list[Message]) -> str:
    """The tagged answer, else the whole final reply."""
    text = final_text(completion)
    tagged = extract_tag(text, TAG)
    return tagged if tagged is not None else text.strip()


def parse_answer(task: Task, completion: list[Message]) -> str | None:
    """The answer as scored; None for an empty reply (the whole reply counts when it has no tag)."""
    return answer_of(completion) or None


def reversal(task: Task, completion: list[Message]) -> float:
    """Normalized Levenshtein similarity to info.target, in [0, 1]."""
    return similarity(answer_of(completion), task["info"]["target"])


def exact(task: Task, completion: list[Message]) -> float:
    """1.0 for a character-exact reversal (a metric: weight 0)."""
    return float(answer_of(completion) == task["info"]["target"])


def formatted(task: Task, completion: list[Message]) -> float:
    """1.0 when the reply uses the <reversed> tag (a metric: weight 0)."""
    return float(extract_tag(final_text(completion), TAG) is not None)


REWARDS = {reversal: 1.0, exact: 0.0, formatted: 0.0}
REWARD_RANGE = (0.0, 1.0)
