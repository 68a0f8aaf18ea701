"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
