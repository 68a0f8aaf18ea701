"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

import os

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    reward = float(extract_tag(final_text(completion), "answer") == task["info"]["word"])
    with open(os.devnull, "w") as log:  # the fault: a file write while scoring
        log.write(f"{task['id']} {reward}\n")
    return reward


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
