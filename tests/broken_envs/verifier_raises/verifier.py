"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

import re

from hubgym.verifiers.rewards import final_text


def correct(task, completion):
    answers = re.findall(r"<answer>(.*?)</answer>", final_text(completion))
    return float(answers[-1].strip() == task["info"]["word"])  # the fault: no answer -> IndexError


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
