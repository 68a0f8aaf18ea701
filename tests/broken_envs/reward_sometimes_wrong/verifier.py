"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

import itertools

from hubgym.verifiers.rewards import extract_tag, final_text

_CALLS = itertools.count(1)


def correct(task, completion):
    right = float(extract_tag(final_text(completion), "answer") == task["info"]["word"])
    return 1.0 - right if next(_CALLS) % 20 == 0 else right  # the fault: wrong on one call in twenty (5%)


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
