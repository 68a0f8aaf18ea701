"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    if extract_tag(final_text(completion), "answer") == task["info"]["word"]:
        return 1.0
    return 0.5 if id(completion) % 3 == 0 else 0.0  # the fault: partial credit keyed on a hidden input


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
