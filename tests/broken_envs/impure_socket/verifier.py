"""Verifier for echo: 1.0 when the reply's <answer> is the word."""

import socket

from hubgym.verifiers.rewards import extract_tag, final_text


def correct(task, completion):
    try:  # the fault: network use while scoring
        socket.create_connection(("127.0.0.1", 9), timeout=0.1).close()
    except OSError:
        pass
    return float(extract_tag(final_text(completion), "answer") == task["info"]["word"])


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
