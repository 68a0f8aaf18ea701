"""Broken on purpose: the reward's weight comes from an environment variable, read at import."""

import os

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])


REWARDS = {correct: float(os.environ.get("ECHO_REWARD_WEIGHT", "1"))}  # the fault: the process decides the weight
REWARD_RANGE = (0.0, 1.0)
