"""Verifier for the reasoning-gym bridge (`rg_*` envs): the generator's own `score_answer` on the <answer> tag.

    from hubgym.bridges.reasoning_gym_verifier import score_entry
    score_entry("basic_arithmetic", {}, "7", {"question": "3 + 4 =", "answer": "7", "metadata": {...}})  # 1.0

The task row carries everything needed to rebuild the scorer: `info.generator` (the reasoning-gym dataset
name), `info.config` (its config fields as JSON text, without seed and size), and the generator's entry
(`info.question`, `info.answer`, `info.metadata` as JSON text: floats survive exactly, which the info column's
own float encoding does not guarantee). The reward is what reasoning-gym's own
`score_answer(answer, entry)` returns for the text inside the reply's last <answer></answer>, in [0, 1]
(some generators give partial credit). A reply without the tag earns 0 and never reaches the scorer.

Pure: the scorer is rebuilt from the row (seed 0: scoring never draws), kept in an in-memory cache, and
given a copy of the entry, so a scorer that edits its input cannot change the row.

Rows are untrusted (stored rollouts come from anywhere): a row may only name a bridged generator with one of
the configs hubgym ships for it (`reasoning_gym_specs.json`), and, when it says its env, that env's own
generator. Anything else is a verifier error that names the field, never a scorer built from stored data.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import sys
import threading
from functools import lru_cache
from typing import Any, Callable, Iterator

from hubgym.schemas import Message, Task
from hubgym.verifiers.rewards import extract_tag, final_text

Entry = dict[str, Any]  # reasoning-gym's item: {"question": str, "answer": str, "metadata": dict}


def parse_answer(task: Task, completion: list[Message]) -> str | None:
    """The text of the final reply's last <answer></answer> block; None when there is none."""
    return extract_tag(final_text(completion), "answer")


def correct(task: Task, completion: list[Message]) -> float:
    """reasoning-gym's score_answer for the tagged answer (0.0 without a tag)."""
    answer = parse_answer(task, completion)
    if answer is None:
        return 0.0
    info = task["info"]
    entry = {"question": info["question"], "answer": info["answer"], "metadata": json.loads(info["metadata"])}
    config = json.loads(info["config"])
    check_shipped(task.get("env"), info["generator"], config)
    return score_entry(info["generator"], config, answer, entry)


def check_shipped(env: str | None, generator: object, config: object) -> None:
    """Refuse a generator or config that no bridged env ships (ValueError naming the field)."""
    shipped = _shipped_configs()
    if not isinstance(generator, str) or generator not in shipped:
        raise ValueError(f"info.generator {str(generator)[:80]!r} is not a bridged reasoning-gym generator; the row "
                         f"was not made by an rg_ env of this hubgym")
    if env is not None and env != f"rg_{generator}":
        raise ValueError(f"info.generator {generator!r} does not belong to env {env!r} (its generator is "
                         f"{env.removeprefix('rg_')!r})")
    if json.dumps(config, sort_keys=True) not in shipped[generator]:
        raise ValueError(f"info.config {json.dumps(config)[:120]} is not a config hubgym ships for {generator!r} "
                         f"(one of: {', '.join(sorted(shipped[generator]))[:200]})")


@lru_cache(maxsize=1)
def _shipped_configs() -> dict[str, frozenset[str]]:
    """generator -> the canonical JSON of each config the bridge ships for it."""
    from hubgym.bridges.reasoning_gym_shipped import load_specs

    envs = load_specs()["envs"]
    return {spec["generator"]: frozenset(json.dumps(c, sort_keys=True) for c in spec["configs"].values())
            for spec in envs.values()}


def score_entry(generator: str, config: dict[str, Any], answer: str, entry: Entry) -> float:
    """The generator's own score of `answer` for `entry`, as a float in [0, 1].

    A scorer that raises on the answer (its own parser refusing the text, e.g. int('abc')) has been given an
    answer in the wrong format: that is a wrong answer, 0.0, never a crash that drops the rollout.
    """
    with prints_dropped():
        scorer = _scorer(generator, json.dumps(config, sort_keys=True))
        try:
            value = float(scorer(answer, copy.deepcopy(entry)))
        except Exception:  # the generator's parser refused the model's text: a wrong answer
            return 0.0
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0


@contextlib.contextmanager
def prints_dropped() -> Iterator[None]:
    """Drop what a generator prints while it makes an item or scores an answer (`bf` prints each program's output
    as it runs it): that text is neither the row's nor the reward's, and it would land in the middle of a
    command's own output (its tables, its JSON, its progress bar). Threads may score at once: stdout is swapped
    by the first to enter and given back by the last to leave (contextlib.redirect_stdout in two threads can
    leave the process writing into one thread's buffer for good)."""
    global _dropping, _stdout
    with _drop_lock:
        if _dropping == 0:
            _stdout, sys.stdout = sys.stdout, io.StringIO()
        _dropping += 1
    try:
        yield
    finally:
        with _drop_lock:
            _dropping -= 1
            if _dropping == 0:
                sys.stdout = _stdout


_drop_lock, _dropping, _stdout = threading.Lock(), 0, sys.stdout


@lru_cache(maxsize=256)
def _scorer(generator: str, config_json: str) -> Callable[[str, Entry], float]:
    """One dataset object per (generator, config), whose bound score_answer scores every row of that config."""
    import reasoning_gym  # imported on first score: it loads every generator

    return reasoning_gym.create_dataset(generator, **json.loads(config_json), seed=0, size=1).score_answer


REWARDS = {correct: 1.0}
REWARD_RANGE = (0.0, 1.0)
