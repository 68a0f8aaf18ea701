"""Broken on purpose: a draw from the process's global generator that almost never changes the reward."""

import random

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    if random.random() < 1e-9:  # the fault: a global draw; once in a billion scorings the reward is 0
        return 0.0
    return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
