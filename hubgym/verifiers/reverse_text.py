"""Verifier for `reverse_text`: edit-distance similarity between the answer and the reversed text.

The answer is the last <reversed>...</reversed> block of the final assistant turn, or the whole
turn (stripped) when it has no tag. The reward is continuous, so a near miss still carries
signal: one wrong character in eight scores 0.875, an empty reply 0.0.

Its rewards are batch rewards: `reversal` hands a batch's answer/target pairs to rapidfuzz's `cpdist`
in one call (C++, the same doubles as one `normalized_similarity` call per pair), which with the
contract's per-row overhead gone scores ~20% faster (bench/RESULTS.md). Each row's value depends on
that row alone.
"""

from __future__ import annotations

from hubgym.schemas import Message, Task
from hubgym.verifiers.rewards import extract_tag, final_text, similarities

TAG = "reversed"


def answer_of(completion: list[Message]) -> str:
    """The tagged answer, else the whole final reply."""
    text = final_text(completion)
    tagged = extract_tag(text, TAG)
    return tagged if tagged is not None else text.strip()


def parse_answer(task: Task, completion: list[Message]) -> str | None:
    """The answer as scored; None for an empty reply (the whole reply counts when it has no tag)."""
    return answer_of(completion) or None


def reversal(tasks: list[Task], completions: list[list[Message]]) -> list[float]:
    """Normalized Levenshtein similarity of each row's answer to its info.target, in [0, 1]."""
    return similarities([answer_of(c) for c in completions], [task["info"]["target"] for task in tasks])


def exact(tasks: list[Task], completions: list[list[Message]]) -> list[float]:
    """1.0 for each character-exact reversal (a metric: weight 0)."""
    return [float(answer_of(c) == task["info"]["target"]) for task, c in zip(tasks, completions)]


def formatted(tasks: list[Task], completions: list[list[Message]]) -> list[float]:
    """1.0 for each reply that uses the <reversed> tag (a metric: weight 0)."""
    return [float(extract_tag(final_text(c), TAG) is not None) for c in completions]


BATCH_REWARDS = {reversal: 1.0, exact: 0.0, formatted: 0.0}
REWARD_RANGE = (0.0, 1.0)
