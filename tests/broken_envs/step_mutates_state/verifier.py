"""Verifier for guess, broken on purpose: step counts guesses in the state it is given."""

import re

REWARDS = {}  # every reward comes from step
REWARD_RANGE = (0.0, 1.0)


def reset(task):
    return {"guesses": 0}, "Guess a number from 1 to 20."


def step(task, state, action):
    state["guesses"] += 1  # the fault: the dict reset returned (shared by a group's samples) changes
    guesses = state["guesses"]
    found = re.findall(r"<guess>\s*(\d+)\s*</guess>", action)
    target = task["info"]["target"]
    if found and int(found[-1]) == target:
        return {"guesses": guesses}, "Correct!", 1.0, True
    if not found:
        hint = "Give one number inside <guess></guess>."
    else:
        hint = "Higher." if int(found[-1]) < target else "Lower."
    return {"guesses": guesses}, hint, 0.0, guesses >= task["info"]["max_guesses"]
