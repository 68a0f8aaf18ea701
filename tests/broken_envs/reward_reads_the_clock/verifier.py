"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

from datetime import datetime

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])


def weekend(task, completion):
    return float(datetime.now().weekday() >= 5)  # the fault: the metric depends on the day it is scored


REWARDS = {correct: 1.0, weekend: 0.0}
REWARD_RANGE = (0.0, 1.0)
