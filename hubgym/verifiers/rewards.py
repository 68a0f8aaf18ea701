"""Shared, pure reward helpers: answer extraction, math equivalence, similarity, tool-call shaping."""

from __future__ import annotations

import re
from functools import lru_cache

from hubgym.schemas.messages import TOOL_ERROR_PREFIX, Message
from hubgym.schemas.tasks import Task

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")


def final_text(completion: list[Message]) -> str:
    """Content of the last assistant turn that is not a tool call ('' when there is none)."""
    for m in reversed(completion):
        if m["role"] == "assistant" and not m.get("tool_calls"):
            return m["content"] or ""
    return ""


def extract_tag(text: str, tag: str) -> str | None:
    """Inner text of the last `<tag>...</tag>` block, stripped; None when absent."""
    found = _tag_pattern(tag).findall(text)
    return found[-1].strip() if found else None


@lru_cache(maxsize=64)
def _tag_pattern(tag: str) -> re.Pattern:
    """Compiled once per tag: `re`'s own cache still formats the pattern and checks the flags on every call,
    which cost as much as the match itself on short replies."""
    return re.compile(rf"<{tag}>(.*?)</{tag}>", re.S)


def extract_boxed(text: str) -> str | None:
    found = _BOXED.findall(text)
    return found[-1].strip() if found else None


def extract_last_number(text: str) -> str | None:
    """The last number in the text, with thousands separators removed ('1,234' -> '1234')."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def extract_answer(text: str) -> str | None:
    """An answer in priority order: <answer> tag, \\boxed{}, then the last number."""
    return extract_tag(text, "answer") or extract_boxed(text) or extract_last_number(text)


def asks_for_tag(task: Task, tag: str = "answer") -> bool:
    """Whether the task's prompt asks for the answer inside <tag></tag> (then nothing else is an answer)."""
    marker = f"<{tag}>"
    return any(marker in (m["content"] or "") for m in task["prompt"])


def answer_in_format(task: Task, completion: list[Message], tag: str = "answer") -> str | None:
    """The answer in the format the task asks for: the last <tag> when its prompt asks for the tag (a number
    elsewhere in the reply is no answer), else `extract_answer` (tag, \\boxed{}, then the last number)."""
    text = final_text(completion)
    return extract_tag(text, tag) if asks_for_tag(task, tag) else extract_answer(text)


def math_equal(predicted: str | None, gold: str) -> bool:
    """Mathematical equivalence via math-verify (so '0.5', '1/2' and '\\frac{1}{2}' agree)."""
    if predicted is None or not predicted.strip():
        return False
    from math_verify import parse, verify  # imported here: sympy-backed, slow to import

    gold_parsed = parse(gold if "$" in gold or "\\" in gold else f"${gold}$")
    pred_parsed = parse(predicted if "$" in predicted or "\\" in predicted else f"${predicted}$")
    return bool(gold_parsed) and bool(pred_parsed) and bool(verify(gold_parsed, pred_parsed))


def similarity(a: str, b: str) -> float:
    """Normalized Levenshtein similarity in [0, 1] (1 = identical)."""
    from rapidfuzz.distance import Levenshtein

    return float(Levenshtein.normalized_similarity(a, b))


def similarities(texts: list[str], targets: list[str]) -> list[float]:
    """`similarity` of each (text, target) pair, in one rapidfuzz call: its C++ loop gives each pair the same double
    that `similarity` gives it (float64 asked for; rapidfuzz's default float32 would round them)."""
    if not texts:
        return []
    import numpy as np
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    return process.cpdist(texts, targets, scorer=Levenshtein.normalized_similarity, dtype=np.float64).tolist()


def tool_call_reward(task: Task, completion: list[Message]) -> float:
    """Per-call shaping from `interaction.tool_rewards`: successful calls earn `reward`, up to `max_calls`.

    A call is successful when its tool message does not start with TOOL_ERROR_PREFIX; the count
    comes from the stored tool messages, so re-scoring never re-runs a tool.
    """
    ok: dict[str, int] = {}  # successful calls per tool (a plain dict: Counter costs more than the scoring)
    for m in completion:
        if m["role"] == "tool" and not (m["content"] or "").startswith(TOOL_ERROR_PREFIX):
            ok[m["name"]] = ok.get(m["name"], 0) + 1
    return sum(r["reward"] * min(ok.get(r["tool"], 0), r["max_calls"]) for r in task["interaction"]["tool_rewards"])
