"""Verifier for echo: 1.0 when the reply's <answer> is the word; a length metric relative to the batch (the fault)."""

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(tasks, completions):
    return [float(extract_tag(final_text(c), "answer") == t["info"]["word"]) for t, c in zip(tasks, completions)]


def length(tasks, completions):
    lengths = [len(final_text(c)) for c in completions]
    longest = max(lengths)
    return [n / longest if longest else 0.0 for n in lengths]  # the fault: a share of the batch's longest reply


BATCH_REWARDS = {correct: 1.0, length: 0.0}
REWARD_RANGE = (0.0, 1.0)
