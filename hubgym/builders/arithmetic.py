"""Arithmetic: procedural integer arithmetic, answered in one turn.

Task:
    Evaluate an integer expression such as `37 * 4 - 12` and answer in `<answer>...</answer>`.
Row schema:
    info = {"expression": str, "answer": str}; interaction single_turn, max_turns 1.
Reward:
    correct (weight 1): the extracted answer equals the value. format (weight 0, a metric):
    the reply has an <answer> tag.
Arguments:
    configs easy (1-digit, + -), medium (2-digit, + - *), hard (3 operands up to 3 digits),
    tiny (the 25 sums of 0..4, for training demos with a tiny model);
    TaskConfig.seed and TaskConfig.sizes.
Version history:
    v1: first release.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator

from hubgym.builders.base import TaskBuilder, TaskConfig
from hubgym.schemas import Task, make_task, system, user

SYSTEM = "Solve the arithmetic problem. Reply with the final integer inside <answer></answer>."


@dataclass
class ArithmeticConfig(TaskConfig):
    max_value: int = 9  # operands are drawn from [0, max_value]
    operators: str = "+-"
    operands: int = 2


class Arithmetic(TaskBuilder):
    __doc__ = __doc__
    ENV = "arithmetic"
    VERIFIER = "hubgym.verifiers.arithmetic"
    GOLDEN = "golden/arithmetic.jsonl"
    BUILDER_CONFIG_CLASS = ArithmeticConfig
    BUILDER_CONFIGS = [
        ArithmeticConfig(name="easy", max_value=9, operators="+-", sizes={"train": 150, "test": 30}),
        ArithmeticConfig(name="medium", max_value=99, operators="+-*"),
        ArithmeticConfig(name="hard", max_value=999, operators="+-*", operands=3),
        # All 25 sums of two operands in 0..4, in both splits: small enough for the tiny local model to
        # learn something with GRPO in minutes on a CPU (the demo's training env). Its test split is the
        # same task space, so it measures the policy, not generalization.
        ArithmeticConfig(name="tiny", max_value=4, operators="+", sizes={"train": 25, "test": 25}),
    ]

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        rng, seen = random.Random(seed), set()
        while len(seen) < size:
            expression = self._expression(rng)
            if expression in seen:
                continue
            seen.add(expression)
            info = {"expression": expression, "answer": str(_evaluate(expression))}
            yield make_task(self.ENV, [system(SYSTEM), user(f"What is {expression}?")], info,
                            difficulty=self.config.name)

    def _expression(self, rng: random.Random) -> str:
        cfg = self.config
        terms = [str(rng.randint(0, cfg.max_value))]
        for _ in range(cfg.operands - 1):
            terms += [rng.choice(cfg.operators), str(rng.randint(0, cfg.max_value))]
        return " ".join(terms)


def _evaluate(expression: str) -> int:
    """Evaluate `a op b op c` with the usual precedence (* before + -), without eval()."""
    tokens = expression.split()
    values, ops = [int(tokens[0])], []
    for op, value in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            values[-1] *= int(value)
        else:
            ops.append(op)
            values.append(int(value))
    total = values[0]
    for op, value in zip(ops, values[1:]):
        total = total + value if op == "+" else total - value
    return total
