"""Verifier for guess: higher/lower hints; the step that finds the number earns 1.0."""

import random
import re

REWARDS = {}  # every reward comes from step
REWARD_RANGE = (0.0, 1.0)
CHANCE = random.Random()  # seeded from the operating system: a generator of its own, but unseeded


def reset(task):
    return {"guesses": 0}, "Guess a number from 1 to 20."


def step(task, state, action):
    guesses = state["guesses"] + 1
    found = re.findall(r"<guess>\s*(\d+)\s*</guess>", action)
    target = task["info"]["target"]
    if found and int(found[-1]) == target:
        return {"guesses": guesses}, "Correct!", 1.0, True
    if not found:
        hint = "Give one number inside <guess></guess>."
    else:
        hint = "Higher." if int(found[-1]) < target else "Lower."
    hint += f" (hint #{CHANCE.randint(10**8, 10**9)})"  # the fault: two replays show different text
    return {"guesses": guesses}, hint, 0.0, guesses >= task["info"]["max_guesses"]
