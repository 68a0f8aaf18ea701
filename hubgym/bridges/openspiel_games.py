"""What the `openspiel` family ships beside its code, and the opponents its configs name: a table of data, apart
from the builder and the verifier (both read it; neither imports OpenSpiel to list envs).

    load_specs()["envs"]["os_chess"]["configs"]     # {'random': {'kind': 'random'}, 'easy': {...}, ...}
    load_specs()["excluded"]["goofspiel"]           # why a game is not an env
    OPPONENTS["medium"]                             # {'kind': 'mcts', 'simulations': 100}

The files are written by the probe (`python -m hubgym.bridges.openspiel_probe`): `openspiel_index.json` (the
catalog rows), `openspiel_specs.json` (per env: the game, its parameters, how its seat sees it, its move limit,
its utility bounds, configs and split sizes; the games left out and the configs dropped, each with why) and
`golden/os_*.jsonl`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
INDEX = HERE / "openspiel_index.json"
SPECS = HERE / "openspiel_specs.json"
GOLDEN_DIR = HERE / "golden"
PREFIX = "os_"

OPPONENTS: dict[str, dict[str, Any]] = {
    "random": {"kind": "random"},
    "easy": {"kind": "mcts", "simulations": 10},
    "medium": {"kind": "mcts", "simulations": 100},
    "hard": {"kind": "mcts", "simulations": 1000},
}
"""The configs of a game for two or more players, in order (the first is the default): a uniformly random legal
move, and OpenSpiel's MCTS bot at three fixed budgets of simulations. One-player games have one config,
SOLO."""
SOLO = {"default": {"kind": "none"}}
VIEWS = ("state", "observation", "information_state")
"""How the model's seat sees the game: the state as OpenSpiel prints it (games of perfect information), or the
seat's own observation or information-state string (games of imperfect information: never the whole state)."""


@cache
def load_specs() -> dict[str, Any]:
    """{"version", "envs": {env: spec}, "excluded": {game: why}, "dropped_configs": {env: {config: why}}}."""
    return json.loads(SPECS.read_text())


@cache
def spec_of_game(game: str, params_json: str) -> dict[str, Any] | None:
    """The shipped spec whose OpenSpiel game and parameters (sorted JSON) are these; None when none ships them."""
    for spec in load_specs()["envs"].values():
        if spec["game"] == game and json.dumps(spec["params"], sort_keys=True) == params_json:
            return spec
    return None
