"""Reverse text: write a short text backwards, character by character; partial credit by edit distance.

Task:
    Reverse the given text ("green apple" -> "elppa neerg") and reply with it inside
    `<reversed>...</reversed>` (a reply without the tag is taken whole). Texts are drawn from
    the shipped word list `data/reverse_text_words.txt`: 1-3 lowercase words, or a 6-12 word
    "sentence" (capitalized, ending with a period).
Row schema:
    info = {"text": str, "target": str (text reversed)}; interaction single_turn, max_turns 1.
    Texts of the "train" split never appear in other splits (a text is held out when its hash
    says so).
Reward:
    similarity (weight 1): normalized Levenshtein similarity between the answer and
    info.target, in [0, 1] (1 = exact; one wrong letter in eight = 0.875). Metrics (weight 0):
    exact, formatted. Total in [0, 1].
Arguments:
    configs words (default: 1-3 words) and sentences (6-12 words); ReverseConfig.min_words,
    .max_words, .sentence; TaskConfig.seed and .sizes.
Version history:
    v1: first release.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from hubgym.builders.base import TaskBuilder, TaskConfig, distinct
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import Task, make_task, system, user

WORDS_FILE = Path(__file__).parent / "data" / "reverse_text_words.txt"
WORDS: tuple[str, ...] = tuple(sorted(set(WORDS_FILE.read_text().split())))
"""The vocabulary texts are drawn from (sorted, so draws do not depend on file order)."""
SYSTEM = ("Reverse the text character by character, spaces and punctuation included (\"green apple.\" becomes "
          "\".elppa neerg\"). Reply with only the reversed text inside <reversed></reversed>.")
HELD_OUT = 5  # one text in HELD_OUT goes to the non-train splits only


@dataclass
class ReverseConfig(TaskConfig):
    min_words: int = 1  # words per text, drawn uniformly from [min_words, max_words]
    max_words: int = 3
    sentence: bool = False  # capitalize the first word and end with a period


class ReverseText(TaskBuilder):
    __doc__ = __doc__
    ENV = "reverse_text"
    TAGS = ("text", "procedural")
    VERIFIER = "hubgym.verifiers.reverse_text"
    GOLDEN = "golden/reverse_text.jsonl"
    BUILDER_CONFIG_CLASS = ReverseConfig
    BUILDER_CONFIGS = [
        ReverseConfig(name="words", min_words=1, max_words=3, sizes={"train": 1000, "test": 100}),
        ReverseConfig(name="sentences", min_words=6, max_words=12, sentence=True, sizes={"train": 1000, "test": 100}),
    ]

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        self._check(split, size)
        rng = random.Random(seed)
        for text in distinct(lambda: self._text(rng), size, keep=lambda text: held_out(text) != (split == "train")):
            yield make_task(self.ENV, [system(SYSTEM), user(f"Reverse this text: {text}")],
                            {"text": text, "target": text[::-1]}, difficulty=self.config.name)

    def _text(self, rng: random.Random) -> str:
        cfg = self.config
        words = rng.choices(WORDS, k=rng.randint(cfg.min_words, cfg.max_words))
        text = " ".join(words)
        return f"{text[0].upper()}{text[1:]}." if cfg.sentence else text

    def _check(self, split: str, size: int) -> None:
        """Word counts and sizes are validated once, before any text is drawn (so drawing always ends)."""
        cfg, where = self.config, Where(self.ENV, self.config.name, split)
        if not 1 <= cfg.min_words <= cfg.max_words:
            raise EnvContractError(f"min_words={cfg.min_words}, max_words={cfg.max_words} is not a word range",
                                   replace(where, field="min_words"), "use 1 <= min_words <= max_words")
        texts = sum(len(WORDS) ** k for k in range(cfg.min_words, cfg.max_words + 1))
        available = texts // HELD_OUT if split != "train" else texts - texts // HELD_OUT  # expected, by the hash split
        if size > available // 2:  # margin: the split is only roughly 1 in HELD_OUT, and drawing slows near the end
            raise EnvContractError(f"split {split!r} asks for {size} texts but only about {available} exist for it",
                                   replace(where, field="sizes"),
                                   f"set sizes[{split!r}] <= {available // 2}, or allow more words per text")


def held_out(text: str) -> bool:
    """One text in HELD_OUT (by hash) is kept out of the train split, so test scores are on unseen texts."""
    return int(hashlib.sha256(f"reverse_text:{text}".encode()).hexdigest(), 16) % HELD_OUT == 0
