"""Tic-tac-toe: play X against a scripted, deterministic O, from a varied opening.

Task:
    The board is shown with free cells numbered 1-9 (row by row from the top left); the model
    names a cell inside `<move>...</move>` (a number, or "b2"-style: column a-c, row 1-3) and O
    replies at once. O wins when it can, blocks X, then takes center, corners, sides, breaking
    ties by a hash of the task seed and the board. An unparseable move or a taken cell is
    answered with the reason; the `max_invalid`-th invalid move forfeits the game.
Row schema:
    info = {"opening": [int], "seed": int, "random_pct": int, "max_invalid": int}: the 1-based
    cells already played, alternating so that O moved last (an even-length opening means X
    started, odd means O started); the seed of O's tie-breaks and random moves; the percent
    of O's moves that are a random legal cell. interaction multi_turn, max_turns = X's moves
    left + max_invalid - 1. Openings of the "train" split never appear in other splits.
Reward:
    Final step: win 1.0, draw 0.5, loss or forfeit 0.0; other steps 0.0. Total in [0, 1].
    Metrics (weight 0): won, invalid_moves.
Arguments:
    configs default (O never plays randomly) and easy (half of O's moves are random legal
    cells); TicTacToeConfig.random_pct, .max_invalid, TaskConfig.seed and .sizes.
Version history:
    v1: first release.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass, replace
from typing import Iterator

from hubgym.builders.base import TaskBuilder, TaskConfig
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import Task, interaction, make_task, system, user

SYSTEM = ("You are playing tic-tac-toe as X against O. Get three X in a row, column or diagonal. Cells are "
          "numbered 1-9 row by row from the top left (or named a1-c3: column a-c, row 1-3 from the top). Reply "
          "with one free cell per turn inside <move></move>, e.g. <move>5</move>. Invalid moves count against you.")
HELD_OUT = 5  # one opening in HELD_OUT is kept out of the train split
MAX_OPENING = 3  # longer random openings often leave X already lost or already won


@dataclass
class TicTacToeConfig(TaskConfig):
    random_pct: int = 0  # percent of O's moves that are a random legal cell (0 = always rule-based)
    max_invalid: int = 3  # the max_invalid-th invalid move forfeits the game


def opening_pool(split: str) -> dict[int, list[tuple[int, ...]]]:
    """Openings (1-based cells) by length; "train" gets those not held out, other splits the rest."""
    pool: dict[int, list[tuple[int, ...]]] = {}
    for length in range(MAX_OPENING + 1):
        for opening in itertools.permutations(range(1, 10), length):
            held = int(hashlib.sha256(f"tictactoe:{opening}".encode()).hexdigest(), 16) % HELD_OUT == 0
            if held == (split != "train"):
                pool.setdefault(length, []).append(opening)
    return pool


def draw_openings(pool: dict[int, list[tuple[int, ...]]], size: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Distinct openings, taking lengths in turn so that the few short ones are not swamped by 3-move ones."""
    queues = [rng.sample(group, len(group)) for _, group in sorted(pool.items())]
    drawn: list[tuple[int, ...]] = []
    while len(drawn) < size and any(queues):  # every opening drawn: the split ends, smaller than `size`
        for queue in queues:
            if queue and len(drawn) < size:
                drawn.append(queue.pop())
    return drawn


class TicTacToe(TaskBuilder):
    __doc__ = __doc__
    ENV = "tictactoe"
    KIND = "multi_turn"
    TAGS = ("games", "board", "procedural")
    VERIFIER = "hubgym.verifiers.tictactoe"
    GOLDEN = "golden/tictactoe.jsonl"
    BUILDER_CONFIG_CLASS = TicTacToeConfig
    BUILDER_CONFIGS = [
        TicTacToeConfig(name="default", sizes={"train": 300, "test": 60}),
        TicTacToeConfig(name="easy", random_pct=50, sizes={"train": 300, "test": 60}),
    ]

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        cfg, rng, pool = self.config, random.Random(seed), opening_pool(split)
        self._check(split, size, sum(map(len, pool.values())))
        for opening in draw_openings(pool, size, rng):
            info = {"opening": list(opening), "seed": rng.randrange(2**31), "random_pct": cfg.random_pct,
                    "max_invalid": cfg.max_invalid}
            x_moves = (9 - len(opening) + 1) // 2  # X moves first on what is left
            spec = interaction("multi_turn", max_turns=x_moves + cfg.max_invalid - 1)
            yield make_task(self.ENV, [system(SYSTEM), user(_intro(opening))], info, spec, difficulty=cfg.name)

    def _check(self, split: str, size: int, available: int) -> None:
        """Sizes, invalid-move limit and random share are validated here, once, before any row is drawn."""
        where, cfg = Where(self.ENV, self.config.name, split), self.config
        if size > available:
            raise EnvContractError(f"split {split!r} asks for {size} tasks but only {available} openings are "
                                   f"available to it", replace(where, field="sizes"),
                                   f"set sizes[{split!r}] <= {available}")
        if cfg.max_invalid < 1:
            raise EnvContractError(f"max_invalid is {cfg.max_invalid}", replace(where, field="max_invalid"),
                                   "use max_invalid >= 1 (1 = the first invalid move forfeits)")
        if not 0 <= cfg.random_pct <= 100:
            raise EnvContractError(f"random_pct is {cfg.random_pct}", replace(where, field="random_pct"),
                                   "use a percent in 0..100")


def _intro(opening: tuple[int, ...]) -> str:
    """The first user turn says who started; the board itself is reset's observation."""
    if not opening:
        return "New game: you move first."
    starter = "you (X)" if len(opening) % 2 == 0 else "O"
    played = "1 move has" if len(opening) == 1 else f"{len(opening)} moves have"
    return f"New game: {starter} started, and {played} been played."
