"""Verifier for spell: 1.0 when the reply's <answer> is the word (tool shaping comes from the rows)."""

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
SUCCESS_THRESHOLD = 1.0
