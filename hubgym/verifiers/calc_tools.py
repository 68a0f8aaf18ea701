"""Verifier for `calc_tools`: the exact integer answer, plus per-call tool shaping.

The answer is the final assistant turn's <answer> tag, else its \\boxed{}, else its last number.
It must hold exactly one number, compared exactly (Decimal, not float: answers run to 18+
digits, where floats round); thousands separators and a leading "$" are fine. Tool shaping
comes from the task's `interaction.tool_rewards` (the builder sets TOOL_REWARD per successful
call, for MAX_REWARDED_CALLS calls) and is added by the contract as component "tool_calls".
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from hubgym.schemas import Message, Task
from hubgym.schemas.messages import TOOL_ERROR_PREFIX
from hubgym.verifiers.rewards import answer_in_format, extract_answer, final_text

TOOL_REWARD = 0.1  # per successful call: a nudge toward the tool, small beside a correct answer
MAX_REWARDED_CALLS = 2  # shaping stops here, so spamming the tool does not pay
REWARD_RANGE = (0.0, 1.0 + TOOL_REWARD * MAX_REWARDED_CALLS)
SUCCESS_THRESHOLD = 1.0  # a correct answer succeeds, with or without tool shaping
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def parse_integer(answer: str | None) -> Decimal | None:
    """The single number in `answer` ("$56,088." -> 56088); None when it has none or several."""
    numbers = _NUMBER.findall(answer or "")
    if len(numbers) != 1:
        return None
    try:
        return Decimal(numbers[0].replace(",", ""))
    except InvalidOperation:
        return None


def parse_answer(task: Task, completion: list[Message]) -> str | None:
    """The answer in the task's format (`answer_found`): the single number inside the <answer> tag the prompt asks
    for; None when there is none (a number elsewhere in the reply is no answer)."""
    value = parse_integer(answer_in_format(task, completion))
    return None if value is None else str(value)


def correct(task: Task, completion: list[Message]) -> float:
    """1.0 when the final reply's single number (tagged, else as written) equals info.answer exactly."""
    value = parse_integer(extract_answer(final_text(completion)))
    return float(value is not None and value == Decimal(task["info"]["answer"]))


def tool_used(task: Task, completion: list[Message]) -> float:
    """1.0 when at least one tool call succeeded (a metric: weight 0)."""
    return float(any(m["role"] == "tool" and not (m["content"] or "").startswith(TOOL_ERROR_PREFIX)
                     for m in completion))


REWARDS = {correct: 1.0, tool_used: 0.0}
