"""Verifier for guess: higher/lower hints; the step that finds the number earns 1.0."""

import re

REWARDS = {}  # every reward comes from step
REWARD_RANGE = (0.0, 1.0)
_HINTS: dict[tuple[int, str], str] = {}  # the fault: keyed on (guess count, action), not on the target


def reset(task):
    return {"guesses": 0}, "Guess a number from 1 to 20."


def step(task, state, action):
    guesses = state["guesses"] + 1
    found = re.findall(r"<guess>\s*(\d+)\s*</guess>", action)
    target = task["info"]["target"]
    if found and int(found[-1]) == target:
        return {"guesses": guesses}, "Correct!", 1.0, True
    key = (guesses, action)
    if key not in _HINTS:
        _HINTS[key] = ("Give one number inside <guess></guess>." if not found
                       else "Higher." if int(found[-1]) < target else "Lower.")
    return {"guesses": guesses}, _HINTS[key], 0.0, guesses >= task["info"]["max_guesses"]
