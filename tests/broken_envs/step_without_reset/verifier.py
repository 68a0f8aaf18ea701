"""Verifier for guess, broken on purpose: step without reset."""

import re

REWARDS = {}  # every reward comes from step
REWARD_RANGE = (0.0, 1.0)


def step(task, state, action):  # the fault: no reset(task) beside it
    guesses = (state or {"guesses": 0})["guesses"] + 1
    found = re.findall(r"<guess>\s*(\d+)\s*</guess>", action)
    target = task["info"]["target"]
    if found and int(found[-1]) == target:
        return {"guesses": guesses}, "Correct!", 1.0, True
    if not found:
        hint = "Give one number inside <guess></guess>."
    else:
        hint = "Higher." if int(found[-1]) < target else "Lower."
    return {"guesses": guesses}, hint, 0.0, guesses >= task["info"]["max_guesses"]
