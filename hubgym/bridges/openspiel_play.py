"""An OpenSpiel game rebuilt from its action history: positions, chance drawn from the task's seed, the seeded bots,
and what a seat may see and do. The verifier (hubgym.bridges.openspiel_verifier) adds hubgym's rules on top.

    state = replay(info, history)              # a fresh OpenSpiel state: the game with `history` applied
    events = advance(info, spec, state, history)   # chance and the bots play until the seat is to move
    legal_at(info, history)                    # {"x(1,1)": 4, ...}: the seat's moves in the game's notation

No OpenSpiel object outlives a call that hands one out: `replay` returns a copy. Memos (loaded games, positions,
bot moves, legal moves) cache pure functions of their keys, so what a call returns never depends on what ran
before it. Chance outcomes and bot seeds come from a hash of (task seed, ply), never from a process generator.

Opponents: {"kind": "random"} plays a uniformly random legal move (by the hash); {"kind": "mcts", "simulations":
N} is OpenSpiel's MCTSBot (UCT c = 2, one random rollout per leaf, solver on) with N simulations, or in a game of
imperfect information its ISMCTSBot, which samples the hidden state from what the bot itself knows (it never
sees the model's cards).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from functools import cache, lru_cache
from typing import Any

UCT_C = 2.0
MEMO_POSITIONS = 512  # positions kept by `replay`'s memo
_POSITIONS: OrderedDict[tuple[str, str, tuple[int, ...]], Any] = OrderedDict()
_POSITIONS_LOCK = threading.Lock()
MAX_MEMORY_MB = 512  # the MCTS tree's bound: far above what 1000 simulations grow, so it never cuts a search


@cache
def load_game(game: str, params_json: str) -> Any:
    """The OpenSpiel game (immutable; loaded once per process)."""
    import pyspiel

    return pyspiel.load_game(game, json.loads(params_json))


def _unit(seed: int, ply: int, salt: str) -> int:
    """A 64-bit number from a hash of the task seed and the ply: the same everywhere."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{ply}:{salt}".encode()).digest()[:8], "big")


def replay(info: dict[str, Any], history: list[int]) -> Any:
    """A fresh OpenSpiel state with `history` applied: a copy of the memo's position when it holds one (the state a
    step ended in is where the next step starts), else the game replayed from its initial state."""
    key = (info["game"], json.dumps(info["params"], sort_keys=True), tuple(history))
    with _POSITIONS_LOCK:
        known = _POSITIONS.get(key)
        if known is not None:
            _POSITIONS.move_to_end(key)
            return known.clone()
    state = load_game(key[0], key[1]).new_initial_state()
    for action in history:
        state.apply_action(action)
    remember(info, history, state)
    return state


def remember(info: dict[str, Any], history: list[int], state: Any) -> None:
    """Keep a copy of the position `history` leads to (a memo of `replay`, bounded: the oldest go first)."""
    key = (info["game"], json.dumps(info["params"], sort_keys=True), tuple(history))
    with _POSITIONS_LOCK:
        _POSITIONS[key] = state.clone()
        while len(_POSITIONS) > MEMO_POSITIONS:
            _POSITIONS.popitem(last=False)


def chance_outcome(state: Any, seed: int, ply: int) -> int:
    """A chance outcome drawn by its probability with a hash of (seed, ply) as the uniform draw."""
    draw, total = _unit(seed, ply, "chance") / 2**64, 0.0
    outcomes = state.chance_outcomes()
    for action, probability in outcomes:
        total += probability
        if draw < total:
            return action
    return outcomes[-1][0]


def bot_move(info: dict[str, Any], history: list[int], state: Any) -> int:
    """The move the row's opponent makes at `state`, the position after `history` (left as it is)."""
    if info["opponent"]["kind"] == "random":
        legal = state.legal_actions()
        return legal[_unit(info["seed"], len(history), "move") % len(legal)]
    return _search(info["game"], json.dumps(info["params"], sort_keys=True), info["opponent"]["simulations"],
                   info["seed"], tuple(history))


@lru_cache(maxsize=4096)
def _search(game: str, params_json: str, simulations: int, seed: int, history: tuple[int, ...]) -> int:
    """OpenSpiel's MCTS (ISMCTS under imperfect information) at a fixed budget, seeded by (seed, ply)."""
    import pyspiel

    loaded, bot_seed = load_game(game, params_json), _unit(seed, len(history), "bot") % 2**31
    state = replay({"game": game, "params": json.loads(params_json)}, list(history))
    evaluator = pyspiel.RandomRolloutEvaluator(1, bot_seed)
    if loaded.get_type().information == pyspiel.GameType.Information.PERFECT_INFORMATION:
        bot = pyspiel.MCTSBot(loaded, evaluator, UCT_C, simulations, MAX_MEMORY_MB, True, bot_seed, False)
    else:
        bot = pyspiel.ISMCTSBot(bot_seed, evaluator, UCT_C, simulations, -1,
                                pyspiel.ISMCTSFinalPolicyType.MAX_VISIT_COUNT, False, False)
    return bot.step(state)


def advance(info: dict[str, Any], spec: dict[str, Any], state: Any, history: list[int]) -> list[str]:
    """Play chance and the bots until the seat is to move or the game ends; what the seat may be told of it."""
    seen = []
    while not state.is_terminal() and state.current_player() != info["seat"]:
        player = state.current_player()
        action = (chance_outcome(state, info["seed"], len(history)) if state.is_chance_node()
                  else bot_move(info, history, state))
        if spec["view"] == "state":  # perfect information: every move is public
            who = "Chance" if state.is_chance_node() else f"Player {player}"
            seen.append(f"{who}: {state.action_to_string(player, action)}")
        state.apply_action(action)
        history.append(action)
    return seen


def legal_moves(state: Any, seat: int) -> dict[str, int]:
    """{move as the game writes it: action id} of the seat's legal moves."""
    return {state.action_to_string(seat, action): action for action in state.legal_actions(seat)}


def legal_at(info: dict[str, Any], history: list[int]) -> dict[str, int]:
    """`legal_moves` of the row's seat at the position after `history` (memoized: naming a chess move costs about
    70 microseconds, and a step names each legal move twice, to show them and to read the reply; never change it)."""
    return _legal_at(info["game"], json.dumps(info["params"], sort_keys=True), tuple(history), info["seat"])


@lru_cache(maxsize=512)
def _legal_at(game: str, params_json: str, history: tuple[int, ...], seat: int) -> dict[str, int]:
    state = replay({"game": game, "params": json.loads(params_json)}, list(history))
    return {} if state.is_terminal() else legal_moves(state, seat)


def view(spec: dict[str, Any], state: Any, seat: int) -> str:
    """The game as the seat may see it (see the module docstring)."""
    if spec["view"] == "state":
        return str(state).rstrip()
    text = state.observation_string(seat) if spec["view"] == "observation" else state.information_state_string(seat)
    return text.rstrip()
