"""The Gymnasium toy-text worlds the `gymnasium` family bridges: how each is made, shown as text, and moved.

    WORLDS["frozen_lake"].make({"map_name": "4x4", "is_slippery": True}, seed=3)   # a reset env (imports gymnasium)
    WORLDS["taxi"].actions                                                          # ('south', 'north', ...)

A world is data plus three small functions: `make(options, seed)` builds the Gymnasium env and resets it with the
seed (random maps are drawn from the seed too), `render(env)` is the text the model reads (Gymnasium's own text
rendering colours the player's cell with terminal codes, which a model does not see, so each world is drawn here),
and `success(env, reward, done)` says when an episode earns full reward.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Callable


@dataclass(frozen=True)
class World:
    """One bridged Gymnasium world."""

    name: str
    title: str
    actions: tuple[str, ...]  # action names, in Gymnasium's action order
    rules: str  # what the system prompt says of the world
    make: Callable[[dict[str, Any], int], Any]
    render: Callable[[Any], str]
    outcome: Callable[[Any, float, bool], float | None]  # the episode's reward when it ended, else None


def _opened(template: Any, seed: int) -> Any:
    """A reset env made from a template: a shallow copy shares the template's transition table (read only, and the
    slow part of building one: 30-80 ms for Taxi and Cliff Walking), and `reset` gives the copy its own state and
    its own generator, so the template itself never moves."""
    env = copy.copy(template)
    env.reset(seed=seed)
    return env


# -- FrozenLake -----------------------------------------------------------------------------------------------

def _frozen_lake(options: dict[str, Any], seed: int) -> Any:
    size = options.get("random_size")
    desc = _random_map(size, seed) if size else None
    return _opened(_lake_template(desc, options.get("map_name", "4x4"), options["is_slippery"]), seed)


@lru_cache(maxsize=1024)
def _random_map(size: int, seed: int) -> tuple[str, ...]:
    """Gymnasium's random map of a size, drawn from the seed (a generator of its own, never the process's)."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    return tuple(generate_random_map(size=size, p=0.8, seed=seed))


@lru_cache(maxsize=256)
def _lake_template(desc: tuple[str, ...] | None, map_name: str, slippery: bool) -> Any:
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

    return FrozenLakeEnv(desc=list(desc) if desc else None, map_name=map_name, is_slippery=slippery)


def _render_lake(env: Any) -> str:
    rows = [[cell.decode() for cell in row] for row in env.desc]
    row, col = divmod(int(env.s), env.ncol)
    rows[row][col] = "*"
    return "\n".join("".join(row) for row in rows)


def _lake_outcome(env: Any, reward: float, done: bool) -> float | None:
    return (1.0 if reward > 0 else 0.0) if done else None


# -- Taxi ----------------------------------------------------------------------------------------------------

TAXI_STOPS = "RGYB"


def _taxi(options: dict[str, Any], seed: int) -> Any:
    return _opened(_taxi_template(options.get("is_rainy", False)), seed)


@lru_cache(maxsize=2)
def _taxi_template(rainy: bool) -> Any:
    from gymnasium.envs.toy_text.taxi import TaxiEnv

    return TaxiEnv(is_rainy=rainy)


def _render_taxi(env: Any) -> str:
    row, col, passenger, destination = (int(x) for x in env.decode(env.s))
    grid = [[cell.decode() for cell in line] for line in env.desc]
    grid[row + 1][2 * col + 1] = "T" if passenger < 4 else "@"  # '@': the taxi with the passenger in it
    where = "in the taxi" if passenger == 4 else f"waiting at {TAXI_STOPS[passenger]}"
    return "\n".join("".join(line) for line in grid) + \
        f"\nTaxi at row {row}, column {col}. Passenger: {where}. Destination: {TAXI_STOPS[destination]}."


def _taxi_outcome(env: Any, reward: float, done: bool) -> float | None:
    return 1.0 if done else None  # Taxi ends only when the passenger is dropped at the destination


# -- CliffWalking ----------------------------------------------------------------------------------------------

def _cliff(options: dict[str, Any], seed: int) -> Any:
    return _opened(_cliff_template(options.get("is_slippery", False)), seed)


@lru_cache(maxsize=2)
def _cliff_template(slippery: bool) -> Any:
    from gymnasium.envs.toy_text.cliffwalking import CliffWalkingEnv

    return CliffWalkingEnv(is_slippery=slippery)


def _render_cliff(env: Any) -> str:
    rows, cols = env.shape
    cells = [["o"] * cols for _ in range(rows)]
    for col in range(1, cols - 1):
        cells[rows - 1][col] = "C"
    cells[rows - 1][cols - 1] = "T"
    row, col = divmod(int(env.s), cols)
    cells[row][col] = "x"
    return "\n".join(" ".join(line) for line in cells)


def _cliff_outcome(env: Any, reward: float, done: bool) -> float | None:
    return 1.0 if done else None  # the only end is the target (a fall sends the walker back to the start)


# -- Blackjack --------------------------------------------------------------------------------------------------

def _blackjack(options: dict[str, Any], seed: int) -> Any:
    return _opened(_blackjack_template(), seed)


@cache
def _blackjack_template() -> Any:
    from gymnasium.envs.toy_text.blackjack import BlackjackEnv

    return BlackjackEnv(natural=False, sab=False)


def _render_blackjack(env: Any) -> str:
    from gymnasium.envs.toy_text.blackjack import sum_hand, usable_ace

    cards = ", ".join(_card(c) for c in env.player)
    ace = " (an ace counts 11)" if usable_ace(env.player) else ""
    return f"Your cards: {cards}: {sum_hand(env.player)}{ace}. Dealer shows: {_card(env.dealer[0])}."


def _card(value: int) -> str:
    return "A" if value == 1 else str(value)


def _blackjack_outcome(env: Any, reward: float, done: bool) -> float | None:
    return (reward + 1.0) / 2.0 if done else None  # win 1.0, draw 0.5, loss 0.0


WORLDS: dict[str, World] = {
    "frozen_lake": World(
        "frozen_lake", "Frozen Lake", ("left", "down", "right", "up"),
        "Walk from S to the goal G over frozen cells F without stepping into a hole H; '*' marks you. The ice may "
        "be slippery: a move can slide you sideways.", _frozen_lake, _render_lake, _lake_outcome),
    "taxi": World(
        "taxi", "Taxi", ("south", "north", "east", "west", "pickup", "dropoff"),
        "Drive the taxi (T; '@' once the passenger is aboard) on the 5x5 grid to the passenger's stop, pick them "
        "up, drive to the destination stop and drop them off. The stops are R, G, Y and B; '|' is a wall. Row 0 "
        "is the top.", _taxi, _render_taxi, _taxi_outcome),
    "cliff_walking": World(
        "cliff_walking", "Cliff Walking", ("up", "right", "down", "left"),
        "Walk from the bottom-left corner to the target T at the bottom right; 'x' marks you. Stepping onto the "
        "cliff C sends you back to the start.", _cliff, _render_cliff, _cliff_outcome),
    "blackjack": World(
        "blackjack", "Blackjack", ("stick", "hit"),
        "Get a hand closer to 21 than the dealer's without going over. 'hit' draws a card; 'stick' stops, and "
        "the dealer then draws to 17 or more. Face cards count 10, an ace 1 or 11.", _blackjack,
        _render_blackjack, _blackjack_outcome),
}
"""Every world of the family, by the name rows give in `info.world`. Stored data never chooses code: a name
outside this table is refused."""
