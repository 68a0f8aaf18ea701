"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    info = task["info"]
    info.setdefault("answer", extract_tag(final_text(completion), "answer"))  # the fault: a cache kept in the task
    return float(info["answer"] == info["word"])


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
