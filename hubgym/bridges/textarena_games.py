"""The TextArena games the `textarena` family bridges, and their difficulty variants (what the builder makes
configs of and the verifier allows in a row): a table of data, apart from both.

    GAMES["ta_mastermind"].textarena_id            # 'Mastermind-v0'
    variants("Mastermind-v0")                      # {'default': {...}, 'extreme': {...}}  (imports TextArena)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WRAPPER_SUFFIXES = ("-train", "-raw")  # TextArena registers each id again per observation wrapper: same game


@dataclass(frozen=True)
class Game:
    """One bridged TextArena game: what the catalog says about it and which registered ids are its configs."""

    engine: str  # its key in hubgym.bridges.textarena_verifier.ENGINES
    textarena_id: str  # the registered base id; it and its "-<difficulty>" variants are the configs
    title: str
    tags: tuple[str, ...]
    description: str
    sizes: dict[str, int] = field(default_factory=lambda: {"train": 200, "test": 50})
    may_not_open: bool = False  # some seeds make TextArena fail at reset: the builder tries each seed first
    extra_move: int = 1  # TextArena checks most turn limits before counting the move: max_turns + 1 valid moves
    turn_limit: int | None = None  # for games without a max_turns argument: the limit TextArena fixes
    skip: tuple[str, ...] = ()  # registered variants left out (see the module docstring)


GAMES: dict[str, Game] = {
    "ta_frozen_lake": Game("frozen_lake", "FrozenLake-v0", "Frozen Lake", ("games", "puzzle", "grid", "navigation"),
                           "walk across a frozen lake to the goal without falling into a hole (TextArena FrozenLake)",
                           turn_limit=100),
    "ta_guess_the_number": Game("guess_the_number", "GuessTheNumber-v0", "Guess The Number",
                                ("games", "puzzle", "search"),
                                "find a secret number from higher/lower hints (TextArena GuessTheNumber)"),
    "ta_lights_out": Game("lights_out", "LightsOut-v0", "Lights Out", ("games", "puzzle", "grid"),
                          "switch off every light of a 5x5 grid where a press toggles its neighbours "
                          "(TextArena LightsOut)",
                          extra_move=0, may_not_open=True),
    "ta_mastermind": Game("mastermind", "Mastermind-v0", "Mastermind", ("games", "puzzle", "deduction"),
                          "crack a secret digit code from black/white peg feedback (TextArena Mastermind)"),
    "ta_sudoku": Game("sudoku", "Sudoku-v0", "Sudoku", ("games", "puzzle", "grid", "logic"),
                      "fill a 9x9 Sudoku grid one cell at a time (TextArena Sudoku)", skip=("hard",),
                      sizes={"train": 100, "test": 25}),
    "ta_tower_of_hanoi": Game("tower_of_hanoi", "TowerOfHanoi-v0", "Tower of Hanoi", ("games", "puzzle", "planning"),
                              "move a disk tower from A to C one disk at a time (TextArena TowerOfHanoi; one fixed "
                              "puzzle per config)", sizes={"train": 1, "test": 1}),
}
"""Every env of the family. Tower of Hanoi draws nothing from its seed, so each config is one puzzle."""


def variants(textarena_id: str, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """{config name: TextArena arguments} of a game's registered difficulty variants, "default" first."""
    from textarena.envs.registration import ENV_REGISTRY

    found = {"default": dict(ENV_REGISTRY[textarena_id].kwargs)}
    for env_id, spec in ENV_REGISTRY.items():
        if env_id.startswith(textarena_id + "-") and not env_id.endswith(WRAPPER_SUFFIXES):
            found[env_id[len(textarena_id) + 1:]] = dict(spec.kwargs)
    return {name: options for name, options in found.items() if name not in skip}
