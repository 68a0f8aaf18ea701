"""The `textarena` family: TextArena's single-player text games as multi_turn envs (`ta_*`).

    from hubgym.bridges.textarena import FAMILY
    FAMILY.entries()                              # the catalog rows, read from textarena.json (no TextArena import)
    Hanoi = FAMILY.builder("ta_tower_of_hanoi")   # a TaskBuilder class; configs default, medium, hard, ...
    hubgym.build_tasks(Hanoi, "medium")["test"]

Each env is one TextArena game (PyPI `textarena`, imported by `builder` and the verifier only). Its configs
are the game's registered difficulty variants (`TowerOfHanoi-v0-medium` -> config "medium"; the plain id is
"default"), with TextArena's own arguments. A row holds the game, those arguments and a seed; the verifier
(`hubgym.bridges.textarena_verifier`) rebuilds the game from the seed and the stored actions at every step, so its
`step` is pure. `write_index()` regenerates the shipped index from the installed TextArena.

Games left out, and why: FifteenPuzzle (its shuffle makes unsolvable boards half the time), Minesweeper (a
mine is an "invalid move" to TextArena, so lifting its invalid-move limit would let a player walk on mines),
Sudoku's "hard" variant (its uniqueness search takes about 0.12 s per board, 30 s of every conformance run),
Wordle, WordLadder, Hangman, SpellingBee and other word games (they download NLTK word lists at reset),
Crosswords (downloads too), Bandit and Blackjack (games of chance: no sure winning line for golden cases).

A step replays the whole history, so it costs O(moves so far). Measured at each config's longest episode (two
invalid moves, then valid moves to the turn limit; one core of a 2-core machine), the last step takes 0.14 ms
(Guess The Number) to 0.65 ms (Mastermind "extreme", 53 replies), 2.0-2.5 ms (Frozen Lake, 103 replies) and
2.3 ms (Tower of Hanoi "extreme", 257 replies; the whole episode 0.33 s). The opening is built once per task
and process and then copied (a Sudoku board: 2-11 ms by config).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Iterator

from hubgym.bridges.textarena_games import GAMES, Game, variants
from hubgym.builders.base import TaskBuilder, TaskConfig
from hubgym.builders.families import FamilyEnv, load_index, unknown_env
from hubgym.builders.families import write_index as write_family_index
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import Task, interaction, make_task, system

HERE = Path(__file__).resolve().parent
INDEX = HERE / "textarena.json"
VERIFIER = "hubgym.bridges.textarena_verifier"
HELD_OUT = 5  # one seed in HELD_OUT is kept out of the train split
SYSTEM = ("You are playing {title}, a single-player text game. The game's rules and its opening follow; the "
          "game answers each reply. Reply with one move per turn, in the bracketed format the rules give. An "
          "invalid move is explained and uses up a turn; the {max_invalid} invalid move loses the game.")


@dataclass
class TextArenaConfig(TaskConfig):
    options: dict[str, Any] = field(default_factory=dict)  # the TextArena env's constructor arguments
    max_invalid: int = 3  # the max_invalid-th invalid move forfeits the game


def index_entries() -> list[FamilyEnv]:
    """The family's catalog rows as the installed TextArena yields them now (imports TextArena)."""
    return [FamilyEnv(name, "multi_turn", tuple(variants(game.textarena_id, game.skip)), game.tags, "textarena",
                      game.description)
            for name, game in sorted(GAMES.items())]


def write_index(path: str | Path = INDEX) -> None:
    """Regenerate the shipped index (`python -c "from hubgym.bridges.textarena import write_index; write_index()"`)."""
    write_family_index(path, index_entries())


def held_out(seed: int) -> bool:
    """Whether a seed belongs to the held-out splits (a hash decides, so train never shares a seed with test)."""
    return int(hashlib.sha256(f"textarena:{seed}".encode()).hexdigest(), 16) % HELD_OUT == 0


class TextArenaGame(TaskBuilder):
    """Base of the family's builders; `FAMILY.builder(name)` makes one subclass per game."""

    KIND = "multi_turn"
    VERIFIER = VERIFIER
    BUILDER_CONFIG_CLASS = TextArenaConfig
    ROWS_IN_RANDOM_ORDER = True  # each row from its own seed: a mixture need not shuffle them
    GAME: Game

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        """Distinct seeds of this split whose game opens without error, each a row."""
        from hubgym.bridges.textarena_verifier import replay

        cfg, rng, game = self.config, random.Random(seed), self.GAME
        self._check(split, size)
        spec = interaction("multi_turn", max_turns=max_turns(game, cfg))
        prompt = [system(SYSTEM.format(title=game.title, max_invalid=_ordinal(cfg.max_invalid)))]
        seen: set[int] = set()
        for _ in range(100 * size + 100):  # bounded: a game that never opens is an error, not a hang
            if len(seen) == size:
                return
            draw = rng.randrange(2**31)
            if draw in seen or held_out(draw) != (split != "train"):
                continue
            info = {"game": game.engine, "options": cfg.options, "seed": draw, "max_invalid": cfg.max_invalid}
            try:
                if game.may_not_open:
                    replay(info, draw, [])
            except ZeroDivisionError:  # e.g. a Lights Out scramble that cancels out: TextArena divides by 0 lights
                continue
            seen.add(draw)
            yield make_task(self.ENV, prompt, info, spec, difficulty=cfg.name, tags=self.TAGS)
        raise EnvContractError(f"found only {len(seen)} playable seeds for split {split!r} of {size} asked",
                               Where(self.ENV, cfg.name, split, field="sizes"), f"set sizes[{split!r}] lower")

    def _check(self, split: str, size: int) -> None:
        """Arguments are validated here, once, before any row is drawn."""
        from hubgym.bridges.textarena_verifier import check_options

        where, cfg = Where(self.ENV, self.config.name, split), self.config
        if cfg.max_invalid < 1:
            raise EnvContractError(f"max_invalid is {cfg.max_invalid}", replace(where, field="max_invalid"),
                                   "use max_invalid >= 1 (1 = the first invalid move loses)")
        limit = cfg.options.get("max_turns", self.GAME.turn_limit)
        if not isinstance(limit, int) or limit < 1:
            raise EnvContractError(f"options.max_turns is {limit!r}",
                                   replace(where, field="options"), "give the game a whole number of turns >= 1")
        try:
            check_options(self.GAME.engine, cfg.options)
        except ValueError as exc:
            raise EnvContractError(str(exc), replace(where, field="options"),
                                   "use the TextArena env's constructor arguments") from None
        if size < 0:
            raise EnvContractError(f"size is {size}", replace(where, field="sizes"), "use sizes >= 0")


def max_turns(game: Game, cfg: TextArenaConfig) -> int:
    """Replies a whole game can take: every valid move the game allows, plus the invalid ones short of a forfeit."""
    return valid_moves(game, cfg) + cfg.max_invalid - 1


def valid_moves(game: Game, cfg: TextArenaConfig) -> int:
    """The valid moves a game allows: its max_turns argument (or fixed limit), plus TextArena's extra one."""
    return cfg.options.get("max_turns", game.turn_limit) + game.extra_move


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


_DOC = """{name}: {description}.

Task:
    Play TextArena's {title} ({textarena_id}) to the end: the opening observation gives the rules and the
    position, each reply is one move, the game answers it. Invalid moves are explained and counted.
Row schema:
    info = {{"game": "{engine}", "options": TextArena's arguments, "seed": int, "max_invalid": int}};
    interaction multi_turn, max_turns = the valid moves the game allows ({moves}) + max_invalid - 1.
    Seeds of the "train" split
    appear in no other split.
Reward:
    Final step: 1.0 when solved, else TextArena's completion share in [0, 1] at the turn limit; 0.0 on a
    forfeit (max_invalid invalid moves); other steps 0.0. Metrics (weight 0): solved, invalid_moves.
Arguments:
    configs {configs} (TextArena's registered variants); TextArenaConfig.options, .max_invalid,
    TaskConfig.seed and .sizes.
Version history:
    v1: first release (textarena 0.7.4).
"""


class _TextArenaFamily:
    """The family object the registry and the catalog use (see hubgym.builders.families.EnvFamily)."""

    name = "textarena"
    prefix = "ta_"

    def entries(self) -> list[FamilyEnv]:
        return load_index(INDEX, source=self.name)

    def builder(self, name: str) -> type[TaskBuilder]:
        if name not in GAMES:
            raise unknown_env(name, self.name, sorted(GAMES))
        return _builder(name)


@cache
def _builder(name: str) -> type[TaskBuilder]:
    """One TaskBuilder subclass per game, made once (so `datasets` fingerprints stay stable)."""
    game = GAMES[name]
    configs = [TextArenaConfig(name=config, options=options, sizes=dict(game.sizes))
               for config, options in variants(game.textarena_id, game.skip).items()]
    doc = _DOC.format(name=name, description=game.description, title=game.title, textarena_id=game.textarena_id,
                      engine=game.engine, configs=", ".join(c.name for c in configs),
                      moves=(f"TextArena's fixed {game.turn_limit}" if game.turn_limit else "options.max_turns")
                      + " + 1" * game.extra_move)
    attrs = {"__doc__": doc, "__module__": __name__, "ENV": name, "GAME": game, "TAGS": game.tags,
             "GOLDEN": str(HERE / "golden" / f"{name}.jsonl"), "BUILDER_CONFIGS": configs}
    return type("".join(part.title() for part in name.split("_")), (TextArenaGame,), attrs)


FAMILY = _TextArenaFamily()
