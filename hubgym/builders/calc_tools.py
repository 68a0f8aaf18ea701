"""Calc tools: word problems whose arithmetic is too big to do in one's head, solved with a tool.

Task:
    Config `calculator`: products of two 3-5 digit numbers, exact divisions of 5-8 digit
    numbers, powers such as 37 ** 8, and sums of two products, worded as short stories; the
    `calculator` tool is offered. Config `python`: sums over ranges ("the sum of the squares of
    1..n"), prime counts, Fibonacci numbers and digit sums of 2 ** n; the `python` tool is
    offered. Either way the final integer goes inside `<answer>...</answer>`.
Row schema:
    info = {"kind": str (multiply|divide|power|sum_of_products|squares|cubes|primes|fibonacci|
    digits_of_power), "answer": str (an exact integer)}; interaction tool_use, max_turns 4,
    tools [the config's tool], tool_rewards [{tool, reward 0.1, max_calls 2}].
Reward:
    correct (weight 1): the answer equals info.answer exactly ("56,088" counts). Tool shaping
    (component tool_calls): 0.1 per successful call of the offered tool, for at most 2 calls;
    a call whose tool message starts with "Error: " earns nothing. Metric (weight 0):
    tool_used. Total in [0, 1.2].
Arguments:
    configs calculator (default) and python; CalcConfig.tool, .max_turns, TaskConfig.seed and .sizes. The
    test split leaves out the questions its train split holds.
Version history:
    v1: first release. Rows: the test splits no longer repeat train's questions (14 of calculator's 100 did);
        train splits and rewards are unchanged.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hubgym.builders.base import TaskBuilder, TaskConfig, distinct, split_seed
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import Task, interaction, make_task, system, user
from hubgym.verifiers.calc_tools import MAX_REWARDED_CALLS, TOOL_REWARD

SYSTEM = ("Solve the problem. The numbers are too large to work out in your head: use the {tool} tool for the "
          "arithmetic, then give the final integer inside <answer></answer>.")
Problem = tuple[str, int]  # (question, exact answer)


def _multiply(rng: random.Random) -> Problem:
    a, b = rng.randint(100, 99_999), rng.randint(100, 99_999)
    return f"A warehouse holds {a} crates and each crate holds {b} bolts. How many bolts are in the warehouse?", a * b


def _divide(rng: random.Random) -> Problem:
    share, parts = rng.randint(1_000, 99_999), rng.randint(12, 999)
    return (f"A factory shares {share * parts} liters of juice equally among {parts} tanks. "
            f"How many liters go into each tank?"), share


def _power(rng: random.Random) -> Problem:
    base, hours = rng.randint(11, 99), rng.randint(5, 9)
    return (f"A culture starts as one cell and every cell splits into {base} cells each hour. "
            f"How many cells are there after {hours} hours?"), base ** hours


def _sum_of_products(rng: random.Random) -> Problem:
    chairs, chair_price, desks, desk_price = (rng.randint(100, 9_999) for _ in range(4))
    return (f"A school buys {chairs} chairs at ${chair_price} each and {desks} desks at ${desk_price} each. "
            f"How many dollars does it spend?"), chairs * chair_price + desks * desk_price


def _squares(rng: random.Random) -> Problem:
    n = rng.randint(100, 9_999)
    return f"What is the sum of the squares of the integers from 1 to {n}?", n * (n + 1) * (2 * n + 1) // 6


def _cubes(rng: random.Random) -> Problem:
    n = rng.randint(100, 9_999)
    return f"What is the sum of the cubes of the integers from 1 to {n}?", (n * (n + 1) // 2) ** 2


def _primes(rng: random.Random) -> Problem:
    n = rng.randint(1_000, 50_000)
    sieve = bytearray([1]) * n
    sieve[:2] = b"\0\0"
    for p in range(2, int(n ** 0.5) + 1):
        if sieve[p]:
            sieve[p * p::p] = bytes(len(range(p * p, n, p)))
    return f"How many prime numbers are smaller than {n}?", sum(sieve)


def _fibonacci(rng: random.Random) -> Problem:
    n = rng.randint(60, 300)
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return f"With F(1) = F(2) = 1 and F(k) = F(k-1) + F(k-2), what is the Fibonacci number F({n})?", a


def _digits_of_power(rng: random.Random) -> Problem:
    n = rng.randint(100, 2_000)
    return f"What is the sum of the decimal digits of 2 ** {n}?", sum(map(int, str(2 ** n)))


GENERATORS: dict[str, dict[str, Callable[[random.Random], Problem]]] = {
    "calculator": {"multiply": _multiply, "divide": _divide, "power": _power, "sum_of_products": _sum_of_products},
    "python": {"squares": _squares, "cubes": _cubes, "primes": _primes, "fibonacci": _fibonacci,
               "digits_of_power": _digits_of_power},
}
"""Problem kinds per offered tool; each draws (question, answer) from the rng."""


@dataclass
class CalcConfig(TaskConfig):
    tool: str = "calculator"  # the tool offered (and shaped): a key of GENERATORS
    max_turns: int = 4  # assistant turns: tool calls plus the final answer


class CalcTools(TaskBuilder):
    __doc__ = __doc__
    ENV = "calc_tools"
    KIND = "tool_use"
    TOOLS = ("calculator", "python")
    TAGS = ("math", "tools", "code")
    VERIFIER = "hubgym.verifiers.calc_tools"
    GOLDEN = "golden/calc_tools.jsonl"
    BUILDER_CONFIG_CLASS = CalcConfig
    BUILDER_CONFIGS = [
        CalcConfig(name="calculator", tool="calculator", sizes={"train": 1000, "test": 100}),
        CalcConfig(name="python", tool="python", sizes={"train": 1000, "test": 100}),
    ]

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        tool = self.config.tool
        if tool not in GENERATORS:
            raise EnvContractError(f"tool {tool!r} has no problem generators", Where(self.ENV, self.config.name, split,
                                   field="tool"), f"set CalcConfig.tool to one of {sorted(GENERATORS)}")
        spec = interaction("tool_use", max_turns=self.config.max_turns, tools=[tool],
                           tool_rewards=[{"tool": tool, "reward": TOOL_REWARD, "max_calls": MAX_REWARDED_CALLS}])
        prompt_head = [system(SYSTEM.format(tool=tool))]
        banned = (frozenset() if split == "train" or "train" not in self.config.sizes else
                  frozenset(q for _, q, _ in _problems(GENERATORS[tool], split_seed(self.config.seed, "train"),
                                                        self.config.sizes["train"], frozenset())))
        for kind, question, answer in _problems(GENERATORS[tool], seed, size, banned):
            yield make_task(self.ENV, [*prompt_head, user(question)], {"kind": kind, "answer": str(answer)}, spec,
                            difficulty=self.config.name, tags=[kind])


def _problems(kinds: dict[str, Callable[[random.Random], Problem]], seed: int, size: int,
              banned: frozenset[str]) -> Iterator[tuple[str, str, Any]]:
    """(kind, question, answer) drawn from the seed: no question twice, none in `banned` (the train split's, when
    drawing another split)."""
    rng = random.Random(seed)

    def draw() -> tuple[str, str, Any]:
        kind = rng.choice(sorted(kinds))
        return kind, *kinds[kind](rng)
    yield from distinct(draw, size, key=lambda drawn: drawn[1], keep=lambda drawn: drawn[1] not in banned)
