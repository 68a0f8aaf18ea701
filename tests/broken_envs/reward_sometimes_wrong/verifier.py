"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

import random

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    right = float(extract_tag(final_text(completion), "answer") == task["info"]["word"])
    return 1.0 - right if random.random() < 0.05 else right  # the fault: wrong on about one call in twenty


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
