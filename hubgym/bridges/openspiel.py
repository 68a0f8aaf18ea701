"""The `openspiel` family: OpenSpiel's turn-based games as multi_turn envs (`os_*`), one seat played by the model.

    from hubgym.bridges.openspiel import FAMILY
    FAMILY.entries()                    # the catalog rows, from openspiel_index.json (no OpenSpiel import)
    Chess = FAMILY.builder("os_chess")  # a TaskBuilder class; configs random, easy, medium, ...
    hubgym.build_tasks(Chess, "easy")["test"]

Each env is one OpenSpiel game (PyPI `open_spiel`, imported by the verifier only) with the parameters the probe
chose (go on a 9x9 board). Its configs are its opponents (hubgym.bridges.openspiel_games.OPPONENTS): `random`
(the default), and OpenSpiel's MCTS bot at 10, 100 and 1000 simulations (`easy`, `medium`, `hard`); a one-player
game has the one config `default`. A row holds the game, its parameters, the model's seat (drawn per row), a seed,
the opponent and the limits; the verifier (hubgym.bridges.openspiel_verifier) rebuilds the game from its action
history at every step, so `step` is pure. Which games are envs, and which are left out with why, is decided by the
probe (`python -m hubgym.bridges.openspiel_probe`) and shipped as JSON beside this module.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Iterator

from hubgym.bridges.openspiel_games import GOLDEN_DIR, INDEX, PREFIX, load_specs
from hubgym.builders.base import TaskBuilder, TaskConfig
from hubgym.builders.families import FamilyEnv, load_index, unknown_env
from hubgym.errors import EnvContractError, EnvNotFoundError, Where
from hubgym.schemas import Task, interaction, make_task, system

VERIFIER = "hubgym.bridges.openspiel_verifier"
HELD_OUT = 5  # one seed in HELD_OUT is kept out of the train split
SYSTEM = ("You are playing {title} (OpenSpiel's `{game}`) as player {seat} of {players}{against}. Each turn shows "
          "the game as OpenSpiel prints it{what} and your legal moves. Reply with exactly one legal move inside "
          "<move></move>, written as listed. An illegal or unreadable move is explained and counted; the "
          "{max_invalid} forfeits the game. The game stops after {move_limit} of your moves at most.")
AGAINST = {"random": " against bots that play uniformly random legal moves",
           "mcts": " against OpenSpiel's MCTS bot ({simulations} simulations a move)", "none": ""}


@dataclass
class OpenSpielConfig(TaskConfig):
    opponent: dict[str, Any] = field(default_factory=lambda: {"kind": "random"})  # see openspiel_games.OPPONENTS
    max_invalid: int = 3  # the max_invalid-th invalid move forfeits the game


def held_out(seed: int) -> bool:
    """Whether a seed belongs to the held-out splits (a hash decides, so train never shares a seed with test)."""
    return int(hashlib.sha256(f"openspiel:{seed}".encode()).hexdigest(), 16) % HELD_OUT == 0


class OpenSpielGame(TaskBuilder):
    """Base of the family's builders; `FAMILY.builder(name)` makes one subclass per game."""

    KIND = "multi_turn"
    VERIFIER = VERIFIER
    BUILDER_CONFIG_CLASS = OpenSpielConfig
    ROWS_IN_RANDOM_ORDER = True  # each row from its own seed: a mixture need not shuffle them
    SPEC: dict[str, Any]

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        """Distinct (seat, seed) draws of this split, each a row; the seat decides the system prompt."""
        cfg, spec, rng = self.config, self.SPEC, random.Random(seed)
        self._check(split, size)
        spec_turns = interaction("multi_turn", max_turns=spec["move_limit"] + cfg.max_invalid - 1)
        seen: set[int] = set()
        while len(seen) < size:
            draw, seat = rng.randrange(2**31), rng.randrange(spec["players"])
            if draw in seen or held_out(draw) != (split != "train"):
                continue
            seen.add(draw)
            info = {"game": spec["game"], "params": spec["params"], "seat": seat, "seed": draw,
                    "opponent": cfg.opponent, "max_invalid": cfg.max_invalid, "move_limit": spec["move_limit"]}
            yield make_task(self.ENV, [system(system_prompt(spec, info))], info, spec_turns, difficulty=cfg.name,
                            tags=self.TAGS)

    def _check(self, split: str, size: int) -> None:
        """Arguments are validated here, once, before any row is drawn."""
        where, cfg = Where(self.ENV, self.config.name, split), self.config
        if cfg.max_invalid < 1 or cfg.max_invalid > 10:
            raise EnvContractError(f"max_invalid is {cfg.max_invalid}", replace(where, field="max_invalid"),
                                   "use max_invalid in 1..10 (1 = the first invalid move forfeits)")
        if cfg.opponent not in self.SPEC["configs"].values():
            raise EnvContractError(f"opponent {cfg.opponent!r} is not one the family ships for this game",
                                   replace(where, field="opponent"),
                                   f"use one of {list(self.SPEC['configs'].values())}")
        if size < 0:
            raise EnvContractError(f"size is {size}", replace(where, field="sizes"), "use sizes >= 0")


def system_prompt(spec: dict[str, Any], info: dict[str, Any]) -> str:
    """The row's system message: the game, the seat, the opponent, the move format and the limits."""
    opponent = info["opponent"]
    return SYSTEM.format(title=spec["title"], game=spec["game"], seat=info["seat"], players=spec["players"],
                         against=AGAINST[opponent["kind"]].format(**opponent),
                         what=" (what your seat can see of it)" if spec["view"] != "state" else "",
                         max_invalid=_ordinal(info["max_invalid"]), move_limit=info["move_limit"])


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


_DOC = """{name}: {description}.

Task:
    Play OpenSpiel's `{game}`{params} as one seat (drawn per row, said in the system prompt) to the end or to
    {move_limit} moves: each observation shows the game as the seat sees it ({view}) and its legal moves in the
    game's notation; a reply names one move inside <move></move>. The other seats are played by the config's bot.
Row schema:
    info = {{"game": "{game}", "params": {{...}}, "seat": int, "seed": int, "opponent": {{"kind", ...}},
    "max_invalid": int, "move_limit": {move_limit}}}; interaction multi_turn, max_turns = move_limit +
    max_invalid - 1. Seeds of the "train" split appear in no other split.
Reward:
    Final step: the seat's return mapped linearly from [{low:g}, {high:g}] into [0, 1] (at the move limit, the
    return of the unfinished game); 0.0 on a forfeit (max_invalid invalid moves); other steps 0.0. No per-move
    shaping. Metrics (weight 0): finished, invalid_moves.
Arguments:
    configs {configs} (the opponent); OpenSpielConfig.opponent, .max_invalid, TaskConfig.seed and .sizes.
Version history:
    v1: first release (open_spiel {version}).
"""


class _OpenSpielFamily:
    """The family object the registry and the catalog use (see hubgym.builders.families.EnvFamily)."""

    name = "openspiel"
    prefix = PREFIX

    def entries(self) -> list[FamilyEnv]:
        return load_index(INDEX, source=self.name)

    def builder(self, name: str) -> type[TaskBuilder]:
        return _builder(name)


@cache
def _builder(name: str) -> type[TaskBuilder]:
    """One TaskBuilder subclass per game, made once (so `datasets` fingerprints stay stable)."""
    specs = load_specs()
    if name not in specs["envs"]:
        game = name.removeprefix(PREFIX)
        if game in specs["excluded"]:
            raise EnvNotFoundError(f"{name!r} is not bridged: OpenSpiel's {game!r} is left out: "
                                   f"{specs['excluded'][game]}")
        raise unknown_env(name, _OpenSpielFamily.name, sorted(specs["envs"]))
    spec = specs["envs"][name]
    configs = [OpenSpielConfig(name=config, opponent=opponent, sizes=dict(spec["sizes"]))
               for config, opponent in spec["configs"].items()]
    doc = _DOC.format(name=name, description=spec["description"], game=spec["game"], move_limit=spec["move_limit"],
                      params=f" with {spec['params']}" if spec["params"] else "", view=spec["view"].replace("_", " "),
                      low=spec["utility"][0], high=spec["utility"][1], configs=", ".join(spec["configs"]),
                      version=specs["version"])
    attrs = {"__doc__": doc, "__module__": __name__, "ENV": name, "SPEC": spec, "TAGS": tuple(spec["tags"]),
             "GOLDEN": str(GOLDEN_DIR / f"{name}.jsonl"), "BUILDER_CONFIGS": configs,
             "LEFT_OUT_CONFIGS": dict(specs["dropped_configs"].get(name, {}))}
    return type("".join(part.title() for part in name.split("_")), (OpenSpielGame,), attrs)


FAMILY = _OpenSpielFamily()
