"""Verifier for `tictactoe`: the model plays X against a scripted, deterministic O.

State (JSON): {"board": str, "invalid": int, "result": str} -- nine cells row by row ("X", "O"
or "." for empty), the invalid moves so far, and "" while the game runs, else one of "win",
"draw", "loss" (O made a line) or "forfeit" (`info.max_invalid` invalid moves).

Opponent: a pure function of the task and the board. With probability `info.random_pct`% (drawn
from a hash of `info.seed` and the board) it plays a random legal cell; otherwise it wins if it
can, blocks X's line, takes the center, then a corner, then a side, breaking ties by the same hash.

Reward: the final step earns 1.0 for a win, 0.5 for a draw, 0.0 for a loss or forfeit; every
other step earns 0.0 (an invalid move is answered with the reason and the board).
"""

from __future__ import annotations

import hashlib
import re

from hubgym.schemas import Message, Task
from hubgym.verifiers.contract import actions_of

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
CORNERS, SIDES, CENTER = (0, 2, 6, 8), (1, 3, 5, 7), 4
EMPTY = "."
OUTCOME_REWARD = {"win": 1.0, "draw": 0.5, "loss": 0.0, "forfeit": 0.0}
_TAG = re.compile(r"<move>(.*?)</move>", re.S | re.I)
_CELL = re.compile(r"\b(?:([abc])([123])|([1-9]))\b", re.I)  # "b2" (column a-c, row 1-3) or 1-9


def parse_move(action: str) -> int | None:
    """The 0-based cell named last in the last <move>...</move> (or in the whole reply); None if none."""
    found = _TAG.findall(action)
    hits = _CELL.findall(found[-1] if found else action)
    if not hits:
        return None
    column, row, number = hits[-1]
    return int(number) - 1 if number else (int(row) - 1) * 3 + "abc".index(column.lower())


def outcome(board: str) -> str:
    """'win' / 'loss' when X / O holds a line, 'draw' on a full board, '' while the game runs."""
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return "win" if board[a] == "X" else "loss"
    return "" if EMPTY in board else "draw"


def render(board: str) -> str:
    """The board with free cells shown by their number, e.g. ' X | 2 | O'."""
    cells = [mark if mark != EMPTY else str(i + 1) for i, mark in enumerate(board)]
    rows = [" " + " | ".join(cells[r:r + 3]) for r in (0, 3, 6)]
    return "\n---+---+---\n".join(rows)


def _hash(info: dict, board: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{info['seed']}:{board}".encode()).digest()[:8], "big")


def opponent_move(info: dict, board: str) -> int:
    """O's reply to `board` (0-based cell); deterministic given the task and the board."""
    h = _hash(info, board)
    free = [i for i, mark in enumerate(board) if mark == EMPTY]
    if h % 100 < info["random_pct"]:
        return free[(h // 100) % len(free)]
    for mark in ("O", "X"):  # complete O's line, else block X's
        for line in LINES:
            cells = [board[i] for i in line]
            if cells.count(mark) == 2 and cells.count(EMPTY) == 1:
                return line[cells.index(EMPTY)]
    for group in ((CENTER,), CORNERS, SIDES):
        options = [i for i in group if board[i] == EMPTY]
        if options:
            return options[h % len(options)]
    raise ValueError(f"opponent asked to move on a full board {board!r}")


def opening_board(opening: list[int]) -> str:
    """Play the 1-based opening cells alternately so that O made the last move (X is to move)."""
    board = [EMPTY] * 9
    for j, cell in enumerate(opening):
        board[cell - 1] = "O" if (len(opening) - 1 - j) % 2 == 0 else "X"
    return "".join(board)


def reset(task: Task) -> tuple[dict, str]:
    """Set up the opening; the observation shows the board and asks for X's move."""
    board = opening_board(task["info"]["opening"])
    return {"board": board, "invalid": 0, "result": ""}, f"{render(board)}\nYou are X. Your move."


def step(task: Task, state: dict, action: str) -> tuple[dict, str, float, bool]:
    """Play X's move and O's reply. An invalid move earns 0 and counts toward a forfeit."""
    info, board = task["info"], state["board"]
    if state["result"]:
        return state, "The game is over.", 0.0, True
    cell = parse_move(action)
    if cell is None or board[cell] != EMPTY:
        return _invalid(info, state, "no cell found; reply with a cell 1-9 inside <move></move>" if cell is None
                        else f"cell {cell + 1} is taken")
    board = board[:cell] + "X" + board[cell + 1:]
    text, result = f"You played {cell + 1}.", outcome(board)
    if not result:
        reply = opponent_move(info, board)
        board = board[:reply] + "O" + board[reply + 1:]
        text, result = f"{text} O played {reply + 1}.", outcome(board)
    ending = {"win": "You win!", "draw": "Draw.", "loss": "O wins.", "": "Your move."}[result]
    new = {"board": board, "invalid": state["invalid"], "result": result}
    return new, f"{text}\n{render(board)}\n{ending}", OUTCOME_REWARD.get(result, 0.0), bool(result)


def _invalid(info: dict, state: dict, why: str) -> tuple[dict, str, float, bool]:
    """Count an invalid move; the `max_invalid`-th one forfeits the game."""
    invalid = state["invalid"] + 1
    if invalid >= info["max_invalid"]:
        text = f"Invalid move: {why}. Too many invalid moves: you lose."
        return {**state, "invalid": invalid, "result": "forfeit"}, text, 0.0, True
    left = info["max_invalid"] - invalid
    text = f"Invalid move: {why}. {left} more invalid {'move forfeits' if left == 1 else 'moves forfeit'} the game."
    return {**state, "invalid": invalid}, f"{text}\n{render(state['board'])}", 0.0, False


def _replay(task: Task, completion: list[Message]) -> dict:
    state, _ = reset(task)
    for action in actions_of(completion):
        if state["result"]:
            break
        state = step(task, state, action)[0]
    return state


def won(task: Task, completion: list[Message]) -> float:
    """1.0 when X made a line (a metric: weight 0)."""
    return float(_replay(task, completion)["result"] == "win")


def invalid_moves(task: Task, completion: list[Message]) -> float:
    """How many moves were unparseable or named a taken cell (a metric: weight 0)."""
    return float(_replay(task, completion)["invalid"])


REWARDS = {won: 0.0, invalid_moves: 0.0}
REWARD_RANGE = (0.0, 1.0)
