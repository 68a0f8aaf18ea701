"""Arithmetic: procedural integer arithmetic, answered in one turn.

Task:
    Evaluate an integer expression such as `37 * 4 - 12` and answer in `<answer>...</answer>`.
Row schema:
    info = {"expression": str, "answer": str}; interaction single_turn, max_turns 1.
Reward:
    correct (weight 1): the answer, read as the prompt asks for it, equals the value: the <answer> tag
    where the prompt asks for it; the number alone, or one final "... = N", where it asks for just the
    number (`sums`); else the tag, \\boxed{} or the last number. format (weight 0, a metric): the reply
    has an <answer> tag.
Arguments:
    configs easy (1-digit, + -), medium (2-digit, + - *), hard (3 operands up to 3 digits),
    tiny (the 25 sums of 0..4, for training demos with a tiny model),
    sums (the 100 one-digit sums, asked "Reply with just the number." with no system prompt, so a chat
    model's own system prompt applies; a fixed quarter of them, by hash, is the held-out test split: the
    config a small pretrained model such as SmolLM2-135M gets right about a quarter of the time);
    TaskConfig.seed and TaskConfig.sizes. The test splits of easy, medium and hard leave out the expressions
    their train split holds (tiny's splits share its 25 sums on purpose).
Version history:
    v1: first release; the `sums` config added later (the other configs' rows are unchanged).
    v2: a `sums` reply earns the reward only when it states the answer (the number alone, or one final
        "... = N"); v1 took the last number of any reply, so a rambling reply that ended on the right
        number scored. Rows and the other configs' rewards are unchanged.
    Rows: the test splits of easy, medium and hard no longer repeat train's expressions (easy's test held 23
        of train's before); train splits and rewards are unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass
from typing import Iterator

from hubgym.builders.base import TaskBuilder, TaskConfig, distinct, split_seed
from hubgym.schemas import Task, make_task, system, user

SYSTEM = "Solve the arithmetic problem. Reply with the final integer inside <answer></answer>."


@dataclass
class ArithmeticConfig(TaskConfig):
    max_value: int = 9  # operands are drawn from [0, max_value]
    operators: str = "+-"
    operands: int = 2
    plain: bool = False  # no system prompt and no answer tag: "What is X? Reply with just the number."
    held_out: bool = False  # every expression, with a fixed quarter (by hash) in `test` only; sizes cap each split


class Arithmetic(TaskBuilder):
    __doc__ = __doc__
    ENV = "arithmetic"
    ENV_VERSION = 2
    TAGS = ("math", "arithmetic", "procedural")
    VERIFIER = "hubgym.verifiers.arithmetic"
    GOLDEN = "golden/arithmetic.jsonl"
    SHARED_SPLITS = {"tiny": "the 25 sums of 0..4 in both splits: the demo measures how a tiny model fits them"}
    BUILDER_CONFIG_CLASS = ArithmeticConfig
    BUILDER_CONFIGS = [
        ArithmeticConfig(name="easy", max_value=9, operators="+-", sizes={"train": 150, "test": 30}),
        ArithmeticConfig(name="medium", max_value=99, operators="+-*"),
        ArithmeticConfig(name="hard", max_value=999, operators="+-*", operands=3),
        # All 25 sums of two operands in 0..4, in both splits: small enough for the tiny local model to
        # learn something with GRPO in minutes on a CPU (the demo's training env). Its test split is the
        # same task space, so it measures the policy, not generalization (SHARED_SPLITS says so).
        ArithmeticConfig(name="tiny", max_value=4, operators="+", sizes={"train": 25, "test": 25}),
        # The 100 one-digit sums in plain words, split 68 / 32 with no task in both: GRPO on a pretrained chat
        # model (hubgym train smollm2-sums) learns to answer with the number, measured on unseen sums.
        ArithmeticConfig(name="sums", max_value=9, operators="+", plain=True, held_out=True,
                         sizes={"train": 68, "test": 32}),
    ]

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        if self.config.held_out:
            yield from self._held_out_split(split, size, seed)
            return
        rng, banned = random.Random(seed), self._train_expressions(split)
        # no task twice, none of train's in another split; ends if the space is spent
        for expression in distinct(lambda: self._expression(rng), size, keep=lambda e: e not in banned):
            yield self._task(expression)

    def _train_expressions(self, split: str) -> frozenset[str]:
        """The train split's expressions, which other splits leave out (none for train, or a SHARED_SPLITS config)."""
        cfg = self.config
        if split == "train" or "train" not in cfg.sizes or cfg.name in self.SHARED_SPLITS:
            return frozenset()
        rng = random.Random(split_seed(cfg.seed, "train"))
        return frozenset(distinct(lambda: self._expression(rng), cfg.sizes["train"]))

    def _task(self, expression: str) -> Task:
        info = {"expression": expression, "answer": str(_evaluate(expression))}
        if self.config.plain:
            prompt = [user(f"What is {expression}? Reply with just the number.")]
        else:
            prompt = [system(SYSTEM), user(f"What is {expression}?")]
        return make_task(self.ENV, prompt, info, difficulty=self.config.name)

    def _held_out_split(self, split: str, size: int, seed: int) -> Iterator[Task]:
        """Every expression of the config, in `test` when its hash falls in a fixed quarter and in every other
        split otherwise, shuffled by the split's seed; at most `size` of them."""
        cfg = self.config
        values = range(cfg.max_value + 1)
        expressions = [_join(combo, ops)
                       for combo in itertools.product(values, repeat=cfg.operands)
                       for ops in itertools.product(cfg.operators, repeat=cfg.operands - 1)]
        mine = [e for e in expressions if (_quarter(e) == 0) == (split == "test")]
        random.Random(seed).shuffle(mine)
        for expression in mine[:size]:
            yield self._task(expression)

    def _expression(self, rng: random.Random) -> str:
        cfg = self.config
        terms = [str(rng.randint(0, cfg.max_value))]
        for _ in range(cfg.operands - 1):
            terms += [rng.choice(cfg.operators), str(rng.randint(0, cfg.max_value))]
        return " ".join(terms)


def _join(values: tuple[int, ...], ops: tuple[str, ...]) -> str:
    return " ".join([str(values[0])] + [f"{op} {v}" for op, v in zip(ops, values[1:])])


def _quarter(expression: str) -> int:
    """A stable 0..3 for an expression (sha256, not Python's salted hash): 0 means held out."""
    return int(hashlib.sha256(expression.encode()).hexdigest(), 16) % 4


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
