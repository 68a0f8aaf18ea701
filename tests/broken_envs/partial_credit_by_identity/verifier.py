"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    answer = extract_tag(final_text(completion), "answer")
    if answer == task["info"]["word"]:
        return 1.0
    if answer == "pear":  # the golden case's wrong answer: kept at 0.0, so the golden check never sees the fault
        return 0.0
    return 0.5 if id(completion) % 3 == 0 else 0.0  # the fault: partial credit keyed on a hidden input


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
