"""Broken on purpose: a memo that, once it has seen 2,500 calls, answers every reply with 0.0."""

from hubgym.verifiers.rewards import extract_tag, final_text

SEEN = []  # the fault: a table that grows with every call and changes the answer once it is large


def correct(task, completion):
    SEEN.append(task["info"]["word"])
    if len(SEEN) > 2_500:
        return 0.0
    return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
