"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])


def penalty(task, completion):
    return -1.0 if not final_text(completion).strip() else 0.0


REWARDS = {correct: 1.0, penalty: 1.0}  # the fault: REWARD_RANGE does not include -1
REWARD_RANGE = (0.0, 1.0)
