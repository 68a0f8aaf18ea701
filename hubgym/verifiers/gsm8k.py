"""Verifier for `gsm8k`: the final number, compared by mathematical equivalence (math-verify).

The answer is taken from the final assistant turn in priority order: the last <answer> tag, the
last \\boxed{}, the last "#### n" line, then the last number in the text. A marked answer that is
not plain math ("$18", "18 dollars", "\\$1,000.") is reduced to its single number; one with two
numbers ("17 or 18") stays as written and earns nothing, so hedging is not rewarded.

Its rewards are batch rewards: `correct` checks each distinct (answer, gold) pair of a batch once.
math-verify costs about half a millisecond a check, and the samples of a group often give the same
answer: a group whose 8 samples agree needs 1 check instead of 8. Each row's value depends on that
row alone.
"""

from __future__ import annotations

import re

from hubgym.schemas import Message, Task
from hubgym.verifiers.rewards import extract_boxed, extract_last_number, extract_tag, final_text, math_equal

_HASHES = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def extract(text: str) -> str | None:
    """The marked answer (tag, boxed, ####), else the last number; None when there is none."""
    hashes = _HASHES.findall(text)
    marked = extract_tag(text, "answer") or extract_boxed(text) or (hashes[-1].strip() if hashes else None)
    return marked if marked else extract_last_number(text)


def candidates(answer: str) -> list[str]:
    """The answer as written, then its only number (currency signs and units dropped), if it has exactly one."""
    numbers = _NUMBER.findall(answer)
    return [answer] + ([numbers[0].replace(",", "")] if len(numbers) == 1 else [])


def parse_answer(task: Task, completion: list[Message]) -> str | None:
    """The final reply's answer (see `extract`); None when it has none."""
    return extract(final_text(completion))


def correct(tasks: list[Task], completions: list[list[Message]]) -> list[float]:
    """1.0 for each row whose extracted answer is mathematically equal to its gold number."""
    verdicts: dict[tuple[str, str], float] = {}  # (answer, gold) -> verdict, within this batch
    out = []
    for task, completion in zip(tasks, completions):
        answer = parse_answer(task, completion)
        if answer is None:
            out.append(0.0)
            continue
        gold = task["info"]["answer"]
        if not isinstance(gold, str):  # a malformed row: checked (and failing) on its own
            out.append(_verdict(answer, gold))
            continue
        if (answer, gold) not in verdicts:
            verdicts[answer, gold] = _verdict(answer, gold)
        out.append(verdicts[answer, gold])
    return out


def _verdict(answer: str, gold: str) -> float:
    return float(any(math_equal(c, gold) for c in candidates(answer)))


def formatted(tasks: list[Task], completions: list[list[Message]]) -> list[float]:
    """1.0 for each reply that marks its answer with <answer>, \\boxed{} or #### (a metric: weight 0)."""
    return [float(bool(extract_tag(text, "answer") or extract_boxed(text) or _HASHES.search(text)))
            for text in map(final_text, completions)]


BATCH_REWARDS = {correct: 1.0, formatted: 0.0}
REWARD_RANGE = (0.0, 1.0)
