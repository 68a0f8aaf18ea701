"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    answer = extract_tag(final_text(completion), "answer")
    if answer == task["info"]["word"]:
        return 1.0
    if answer is None:  # the fault: partial credit keyed on a hidden input (only for untagged replies, so the golden
        return 0.5 if id(completion) % 3 == 0 else 0.0  # cases, all tagged, score as declared whatever the ids)
    return 0.0


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
