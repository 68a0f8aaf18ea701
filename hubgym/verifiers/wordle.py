"""Verifier for `wordle`: find a secret 5-letter word, with Wordle's green/yellow/gray feedback.

State (JSON): {"turn": int, "guesses": [str], "marks": [str], "solved_at": int} -- turns used
(invalid guesses included), the valid guesses with their marks (e.g. "GYXXG"), and the turn
that found the word (0 while unsolved).

Reward: every step earns the *improvement* of a progress score, so the step rewards sum to the
final score. Solved on turn t: 1 - (t - 1) / 16 (1.0 on turn 1, 0.6875 on turn 6, never below
0.5). Unsolved: the best valid guess's (2 * greens + yellows) / 32 (at most 0.3125, so solving
always beats any near miss). Every value is a multiple of 1/32, so the sums are exact floats.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from hubgym.schemas import Message, Task
from hubgym.verifiers.contract import actions_of

WORDS_FILE = Path(__file__).resolve().parent.parent / "builders" / "data" / "wordle_words.txt"
WORDS: frozenset[str] = frozenset(WORDS_FILE.read_text().split())
"""Valid guesses and secrets. Changing the list changes what is rewarded: bump the env version."""
UNIT = 32  # progress is counted in 1/32 steps: dyadic values add up exactly in binary floats
SOLVED = "GGGGG"
_TAG = re.compile(r"<guess>(.*?)</guess>", re.S | re.I)


def marks(secret: str, guess: str) -> str:
    """G (right spot), Y (elsewhere in the word) or X per letter, as real Wordle scores repeats.

    Greens are matched first; a repeated letter is then yellow only while the secret still has
    unmatched copies of it, left to right (secret "crane", guess "error" -> "YGXXX").
    """
    out = ["X"] * len(guess)
    unmatched = Counter(s for s, g in zip(secret, guess) if s != g)
    for i, (s, g) in enumerate(zip(secret, guess)):
        if s == g:
            out[i] = "G"
        elif unmatched[g] > 0:
            out[i] = "Y"
            unmatched[g] -= 1
    return "".join(out)


def parse_guess(action: str) -> str | None:
    """The guess in the last <guess>...</guess>, or a reply that is a single word; None otherwise."""
    found = _TAG.findall(action)
    text = (found[-1] if found else action).strip().strip("\"'`.,!*").lower()
    return text if found or (text and not any(c.isspace() for c in text)) else None


def progress(state: dict) -> int:
    """The progress score in 1/UNIT steps (see the module docstring); never decreases over an episode."""
    if state["solved_at"]:
        return max(UNIT - 2 * (state["solved_at"] - 1), UNIT // 2)
    return max((2 * m.count("G") + m.count("Y") for m in state["marks"]), default=0)


def problem(info: dict, state: dict, guess: str | None) -> str | None:
    """Why a guess is invalid, in words the model can act on; None when it is valid."""
    if guess is None:
        return "no guess found; reply with one word inside <guess></guess>"
    if len(guess) != 5 or not (guess.isascii() and guess.isalpha()):
        return f"{guess!r} is not a 5-letter word"
    if guess not in WORDS:
        return f"{guess!r} is not in the word list"
    return _hard_mode_problem(state, guess) if info.get("hard_mode") else None


def _hard_mode_problem(state: dict, guess: str) -> str | None:
    """Hard mode: greens stay in place and revealed letters (green or yellow) are reused."""
    for previous, mark in zip(state["guesses"], state["marks"]):
        for i, (letter, m) in enumerate(zip(previous, mark)):
            if m == "G" and guess[i] != letter:
                return f"hard mode: letter {i + 1} must be {letter.upper()}"
        revealed = Counter(letter for letter, m in zip(previous, mark) if m != "X")
        for letter, count in sorted(revealed.items()):
            if guess.count(letter) < count:
                return f"hard mode: the guess must contain {letter.upper()}" + (f" {count} times" if count > 1 else "")
    return None


def is_done(info: dict, state: dict) -> bool:
    return bool(state["solved_at"]) or state["turn"] >= info["max_turns"]


def reset(task: Task) -> tuple[dict, str]:
    """The rules are in the prompt, so the opening observation is empty."""
    return {"turn": 0, "guesses": [], "marks": [], "solved_at": 0}, ""


def step(task: Task, state: dict, action: str) -> tuple[dict, str, float, bool]:
    """Score one guess. An invalid guess uses up a turn and earns nothing."""
    info = task["info"]
    if is_done(info, state):
        return state, "The game is over.", 0.0, True
    guess = parse_guess(action)
    why = problem(info, state, guess)
    turn = state["turn"] + 1
    if why:
        new, text = {**state, "turn": turn}, f"Invalid guess: {why}. It used up a turn."
    else:
        mark = marks(info["secret"], guess)
        new = {"turn": turn, "guesses": [*state["guesses"], guess], "marks": [*state["marks"], mark],
               "solved_at": turn if mark == SOLVED else 0}
        text = f"{guess.upper()} -> {' '.join(mark)}."
    done = is_done(info, new)
    if new["solved_at"]:
        text += f" Solved in {turn} {'guess' if turn == 1 else 'guesses'}!"
    elif done:
        text += f" Out of guesses: the word was {info['secret'].upper()}."
    else:
        left = info["max_turns"] - turn
        text += f" {left} {'guess' if left == 1 else 'guesses'} left."
    return new, text, (progress(new) - progress(state)) / UNIT, done


def _replay(task: Task, completion: list[Message]) -> dict:
    """The state the env reached: the guesses it answered, in order."""
    state, _ = reset(task)
    for action in answered_guesses(completion):
        if is_done(task["info"], state):
            break
        state = step(task, state, action)[0]
    return state


def answered_guesses(completion: list[Message]) -> list[str]:
    """The replies the env took as guesses. Every guess is answered with an observation, so a last reply with none
    after it was never stepped: the rollout loop cuts a reply at the token limit and steps nothing (a cut reply is
    no action, and no invalid guess)."""
    actions = actions_of(completion)
    last = completion[-1] if completion else None
    if actions and last is not None and last["role"] == "assistant" and not last.get("tool_calls"):
        return actions[:-1]
    return actions


def solved(task: Task, completion: list[Message]) -> float:
    """1.0 when the word was found (a metric: weight 0)."""
    return float(bool(_replay(task, completion)["solved_at"]))


def invalid_guesses(task: Task, completion: list[Message]) -> float:
    """How many turns went to invalid guesses (a metric: weight 0); a reply cut short is none (`answered_guesses`)."""
    state = _replay(task, completion)
    return float(state["turn"] - len(state["guesses"]))


REWARDS = {solved: 0.0, invalid_guesses: 0.0}
REWARD_RANGE = (0.0, 1.0)
SUCCESS_THRESHOLD = 0.5  # solved on any turn scores >= 0.5; an unsolved game at most 0.3125
