"""Broken on purpose: a metric is hash() of the word, which Python seeds anew in every process."""

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])


def bucket(task, completion):
    return hash(task["info"]["word"]) % 1000 / 1000  # the fault: str hashes differ between processes


REWARDS = {correct: 1.0, bucket: 0.0}
REWARD_RANGE = (0.0, 1.0)
