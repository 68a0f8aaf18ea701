"""Wordle: find a secret 5-letter word in a few guesses, with green/yellow/gray feedback.

Task:
    Guess a secret word from the shipped list (`data/wordle_words.txt`), one guess per turn
    inside `<guess>...</guess>`. After each guess the env answers with one mark per letter:
    G (right letter, right spot), Y (in the word, elsewhere), X (not in the word), repeated
    letters scored as in real Wordle. Invalid guesses (not 5 letters, not in the list, or
    breaking hard-mode rules) get an explanation and use up a turn.
Row schema:
    info = {"secret": str, "max_turns": int, "hard_mode": bool}; interaction multi_turn with
    max_turns = info.max_turns. Secrets of the "train" split never appear in other splits
    (a word is held out when its hash says so), so test scores measure unseen words.
Reward:
    Per-step improvements of a progress score that sum to: 1 - (t - 1) / 16 when solved on
    turn t, else (2 * greens + yellows) / 32 of the best valid guess (at most 0.3125).
    Total in [0, 1]. Metrics (weight 0): solved, invalid_guesses (over the guesses the env answered: a
    reply cut at the token limit is no guess).
Arguments:
    configs default (6 turns) and hard (6 turns, hard mode: greens stay in place and revealed
    letters are reused); WordleConfig.max_turns, .hard_mode, TaskConfig.seed and .sizes.
Version history:
    v1: first release.
    v2: the metrics `solved` and `invalid_guesses` count only the guesses the env answered; v1 also counted a
        last reply cut at the token limit, which the loop never steps (an invalid guess, or a win, that never
        happened). Rows, step rewards and the total reward are unchanged.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace
from typing import Iterator

from hubgym.builders.base import TaskBuilder, TaskConfig
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import Task, interaction, make_task, system, user
from hubgym.verifiers.wordle import WORDS

SYSTEM = ("You are playing Wordle. Guess the secret 5-letter English word. Reply with one guess per turn "
          "inside <guess></guess>. After each guess you get one mark per letter: G = right letter in the right "
          "spot, Y = in the word but in another spot, X = not in the word (a repeated letter is marked Y only "
          "as many times as the word holds it). Invalid guesses use up a turn.")
HARD_RULE = " Hard mode: green letters must stay in place and yellow letters must be reused in later guesses."
HELD_OUT = 5  # one word in HELD_OUT is kept out of the train split


@dataclass
class WordleConfig(TaskConfig):
    max_turns: int = 6  # guesses allowed, invalid ones included
    hard_mode: bool = False  # revealed hints must be used in later guesses


def secret_pool(split: str) -> list[str]:
    """Sorted candidate secrets for a split: "train" gets the words not held out, other splits the rest."""
    held_out = {w for w in WORDS if int(hashlib.sha256(f"wordle:{w}".encode()).hexdigest(), 16) % HELD_OUT == 0}
    return sorted(held_out if split != "train" else WORDS - held_out)


class Wordle(TaskBuilder):
    __doc__ = __doc__
    ENV = "wordle"
    ENV_VERSION = 2
    KIND = "multi_turn"
    TAGS = ("games", "puzzle", "words")
    VERIFIER = "hubgym.verifiers.wordle"
    GOLDEN = "golden/wordle.jsonl"
    BUILDER_CONFIG_CLASS = WordleConfig
    BUILDER_CONFIGS = [
        WordleConfig(name="default", sizes={"train": 500, "test": 100}),
        WordleConfig(name="hard", hard_mode=True, sizes={"train": 500, "test": 100}),
    ]

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        cfg, pool = self.config, secret_pool(split)
        self._check(split, size, len(pool))
        prompt = [system(SYSTEM + (HARD_RULE if cfg.hard_mode else "")),
                  user(f"Guess the secret word. You have {cfg.max_turns} guesses.")]
        spec = interaction("multi_turn", max_turns=cfg.max_turns)
        for secret in random.Random(seed).sample(pool, size):
            info = {"secret": secret, "max_turns": cfg.max_turns, "hard_mode": cfg.hard_mode}
            yield make_task(self.ENV, prompt, info, spec, difficulty=self.config.name)

    def _check(self, split: str, size: int, available: int) -> None:
        """Sizes and turns are validated here, once, before any row is drawn."""
        where = Where(self.ENV, self.config.name, split)
        if size > available:
            raise EnvContractError(f"split {split!r} asks for {size} tasks but only {available} secret words are "
                                   f"available to it", replace(where, field="sizes"),
                                   f"set sizes[{split!r}] <= {available}")
        if self.config.max_turns < 1:
            raise EnvContractError(f"max_turns is {self.config.max_turns}", replace(where, field="max_turns"),
                                   "allow at least one guess (max_turns >= 1)")
