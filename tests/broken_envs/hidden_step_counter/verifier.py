"""Verifier for guess, broken on purpose: after its fourth call, step adds a key to the state it returns."""

import re

REWARDS = {}  # every reward comes from step
REWARD_RANGE = (0.0, 1.0)
_CALLS = 0  # the fault: state kept outside `state`


def reset(task):
    return {"guesses": 0}, "Guess a number from 1 to 20."


def step(task, state, action):
    global _CALLS
    _CALLS += 1
    guesses = state["guesses"] + 1
    found = re.findall(r"<guess>\s*(\d+)\s*</guess>", action)
    target = task["info"]["target"]
    if found and int(found[-1]) == target:
        return {"guesses": guesses}, "Correct!", 1.0, True
    if not found:
        hint = "Give one number inside <guess></guess>."
    else:
        hint = "Higher." if int(found[-1]) < target else "Lower."
    after = {"guesses": guesses, "tired": True} if _CALLS > 4 else {"guesses": guesses}
    return after, hint, 0.0, guesses >= task["info"]["max_guesses"]
