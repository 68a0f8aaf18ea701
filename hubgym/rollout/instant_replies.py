"""Pre-generated, pre-tokenized replies for the instant benchmark server (`instant_server`).

A reply is picked from a fixed table by what the request shows (the assistant turn it asks for and the
last message before it), never by chance and never by sample index, so every client gets the same
trajectory for the same task: hubgym's one request with n samples and verifiers' n requests with one
sample each see the same turns. Each env's table holds valid moves:

- `calc_tools`: turn 0 calls the calculator (one of a few products, picked by a hash of the question),
  later turns answer; 2 assistant turns per rollout.
- `wordle`: a fixed sequence of list words, one per turn, until the env ends the game (6 turns unless a
  guess happens to be the secret).
- `tictactoe`: the free cell the board in the last observation offers first, in an order picked by a hash
  of that board; never an invalid move.
- `arithmetic`, `reverse_text` (single_turn): the right answer in the asked-for tag, the right answer
  without it, or a near miss, picked by a hash of the question (the rewards of a run vary, as a model's do).

    book = ReplyBook.for_env("wordle", tokenizer)
    reply = book.pick(turn=0, last="Guess the secret word. You have 6 guesses.")
    reply.text, reply.ids, reply.logprobs   # '<guess>crane</guess>', [... , <|im_end|> id], [-0.25, ...]
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

ENVS = ("calc_tools", "wordle", "tictactoe", "arithmetic", "reverse_text")
WORDLE_GUESSES = ("crane", "plant", "ghost", "dusty", "blink", "women")  # all in wordle's word list
PRODUCTS = ((123, 456), (789, 12), (4321, 17), (55, 908), (2024, 33), (617, 249))


@dataclass(frozen=True)
class Reply:
    """One reply as the server sends it: text, sampled ids (ending on the stop token) and their logprobs, plus
    the chat-completions view (content and hermes tool calls, as vLLM's hermes parser returns them)."""

    text: str
    ids: list[int]
    logprobs: list[float]
    tokens: list[str]  # each id's token string (the completions `logprobs.tokens` field)
    content: str | None  # chat: the text outside tool calls; None when only tool calls (vLLM's hermes parser)
    tool_calls: list[dict[str, Any]]  # chat: [{"name": ..., "arguments": JSON text}]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _calculator_call(a: int, b: int) -> str:
    return ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + f"{a} * {b}" + '"}}\n</tool_call>')


def calc_tools_text(turn: int, last: str) -> str:
    """Turn 0: a calculator call; later: an answer (the tool's result, when the last message shows one)."""
    if turn == 0:
        return _calculator_call(*PRODUCTS[_hash(last) % len(PRODUCTS)])
    found = re.search(r"-?\d+", last)
    return f"<answer>{found.group(0) if found else 0}</answer>"


def wordle_text(turn: int, last: str) -> str:
    return f"<guess>{WORDLE_GUESSES[turn % len(WORDLE_GUESSES)]}</guess>"


_BOARD_ROW = re.compile(r"^ ([1-9XO]) \| ([1-9XO]) \| ([1-9XO])$", re.M)


def tictactoe_text(turn: int, last: str) -> str:
    """A free cell of the last board shown (free cells show their number), as column+row ('b2')."""
    rows = _BOARD_ROW.findall(last)[-3:]
    free = [int(c) for row in rows for c in row if c.isdigit()]
    if not free:
        return "<move>b2</move>"
    h = _hash(last)
    cell = sorted(free, key=lambda c: _hash(f"{h}:{c}"))[0] - 1
    return f"<move>{'abc'[cell % 3]}{cell // 3 + 1}</move>"


def arithmetic_text(turn: int, last: str) -> str:
    """'What is 3 + 4?' -> '<answer>7</answer>', '7' or '<answer>8</answer>' (by a hash of the question)."""
    from hubgym.tools.calculator import evaluate

    found = re.search(r"What is ([-+*\d ]+)\?", last)
    value = int(evaluate(found.group(1))) if found else 0
    return (f"<answer>{value}</answer>", f"It is {value}", f"<answer>{value + 1}</answer>")[_hash(last) % 3]


def reverse_text_text(turn: int, last: str) -> str:
    """'Reverse this text: ab c' -> '<reversed>c ba</reversed>', 'c ba' or its last letter dropped (by a hash)."""
    target = last.partition("Reverse this text: ")[2][::-1]
    return (f"<reversed>{target}</reversed>", target, f"<reversed>{target[:-1]}</reversed>")[_hash(last) % 3]


POLICIES: dict[str, Callable[[int, str], str]] = {"calc_tools": calc_tools_text, "wordle": wordle_text,
                                                  "tictactoe": tictactoe_text, "arithmetic": arithmetic_text,
                                                  "reverse_text": reverse_text_text}


class ReplyBook:
    """An env's reply policy with every reply tokenized once (`tokenizer` is the served model's)."""

    def __init__(self, env: str, tokenizer: Any, stop_token: str = "<|im_end|>"):
        if env not in POLICIES:
            raise ValueError(f"the instant server has no replies for env {env!r}; use one of {', '.join(ENVS)}")
        self.env, self.policy, self.tokenizer = env, POLICIES[env], tokenizer
        stop = tokenizer.convert_tokens_to_ids(stop_token)
        self.stop_id = stop if isinstance(stop, int) and stop >= 0 else tokenizer.eos_token_id
        self._made: dict[str, Reply] = {}

    @classmethod
    def for_env(cls, env: str, tokenizer: Any) -> ReplyBook:
        return cls(env.split(":")[0], tokenizer)

    def pick(self, turn: int, last: str) -> Reply:
        text = self.policy(turn, last)
        reply = self._made.get(text)
        if reply is None:
            reply = self._made[text] = self._make(text)
        return reply

    def _make(self, text: str) -> Reply:
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.stop_id]
        # Fixed logprobs in [-1, -0.05): what a sampler would return, without randomness.
        logprobs = [-0.05 - (_hash(f"{text}:{i}") % 95) / 100 for i in range(len(ids))]
        tokens = self.tokenizer.convert_ids_to_tokens(ids)
        content, calls = _hermes(text)
        return Reply(text, ids, logprobs, tokens, content, calls)


_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def _hermes(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """What vLLM's hermes tool parser makes of a reply: the text before the first call (None when empty) and the
    calls, arguments as `json.dumps(..., ensure_ascii=False)` of the parsed object."""
    bodies = _CALL.findall(text)
    if not bodies:
        return text, []
    calls = []
    for body in bodies:
        obj = json.loads(body)
        calls.append({"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}), ensure_ascii=False)})
    content = text[:text.find("<tool_call>")]
    return content or None, calls
