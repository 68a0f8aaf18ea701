"""What the pages ask of a run's index: filters, per-env tables, reward histograms, pages of rows, run comparisons.

Everything here works on the small index (`store.Run.index`), never on messages or tokens, so each answer costs
one polars query however large the run is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

PAGE_ROWS = 50
SORTS = {"reward": "reward", "tokens": "tokens", "turns": "num_turns"}
"""What a run's rollouts sort by (`sort=reward`, or `sort=-reward` for largest first): the reward, the model tokens
sampled (a reply's length) and the turns."""
HIST_BINS = 10
CHANGED_BY = 1e-9  # a re-scored reward differs from the stored one by more than this


@dataclass(frozen=True)
class Filters:
    """The rollouts a page lists; every field is optional (None: no filter)."""

    env: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    finish_reason: str | None = None
    truncated: bool | None = None
    error: bool | None = None
    changed: bool | None = None  # re-scored runs: the new reward differs from the stored one
    sort: str | None = None  # a key of SORTS, "-" before it for largest first (None: the order stored)

    @classmethod
    def from_query(cls, query: dict[str, str]) -> "Filters":
        """From a page's query string; blank or unreadable values mean "no filter" (it is the user's own URL)."""
        return cls(env=query.get("env") or None, min_reward=_number(query.get("min_reward")),
                   max_reward=_number(query.get("max_reward")), finish_reason=query.get("finish_reason") or None,
                   truncated=_flag(query.get("truncated")), error=_flag(query.get("error")),
                   changed=_flag(query.get("changed")), sort=_sort(query.get("sort")))

    def query(self) -> dict[str, str]:
        """The query string that gives these filters back (for paging links)."""
        out = {}
        for name, value in self.__dict__.items():
            if value is not None:
                out[name] = ("yes" if value else "no") if isinstance(value, bool) else str(value)
        return out


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _sort(text: str | None) -> str | None:
    return text if text and text.removeprefix("-") in SORTS else None


def _flag(text: str | None) -> bool | None:
    return {"yes": True, "no": False}.get(text or "")


def changed_expr() -> pl.Expr:
    old, new = pl.col("reward"), pl.col("rescore_reward")
    return (old.is_null() != new.is_null()) | ((old - new).abs() > CHANGED_BY).fill_null(False)


def apply_filters(index: pl.DataFrame, f: Filters) -> pl.DataFrame:
    out = index
    if f.env is not None:
        out = out.filter(pl.col("env") == f.env)
    if f.min_reward is not None:
        out = out.filter(pl.col("reward") >= f.min_reward)
    if f.max_reward is not None:
        out = out.filter(pl.col("reward") <= f.max_reward)
    if f.finish_reason is not None:
        out = out.filter(pl.col("finish_reason") == f.finish_reason)
    if f.truncated is not None:
        out = out.filter(pl.col("truncated") == f.truncated)
    if f.error is not None:
        out = out.filter(pl.col("error").is_not_null() == f.error)
    if f.changed is not None and "rescore_reward" in out.columns:
        out = out.filter(changed_expr() == f.changed)
    return out


def page(index: pl.DataFrame, f: Filters, number: int,
         size: int = PAGE_ROWS) -> tuple[list[dict[str, Any]], int, int]:
    """(the rows of page `number` (from 0) of `size` rows, how many rows match, how many pages)."""
    matching = sorted_by(apply_filters(index, f), f.sort)
    return _slice(matching, number, size)


def sorted_by(frame: pl.DataFrame, sort: str | None) -> pl.DataFrame:
    """The rows in `sort` order (ties and rows without a value keep the order stored, the latter last)."""
    column = SORTS.get((sort or "").removeprefix("-"))
    if column is None or column not in frame.columns:
        return frame
    return frame.sort(column, descending=sort.startswith("-"), nulls_last=True, maintain_order=True)


def _slice(frame: pl.DataFrame, number: int, size: int) -> tuple[list[dict[str, Any]], int, int]:
    pages = max(1, math.ceil(frame.height / size))
    number = min(max(number, 0), pages - 1)
    return frame.slice(number * size, size).to_dicts(), frame.height, pages


def env_table(index: pl.DataFrame) -> list[dict[str, Any]]:
    """One line per env: rollouts, tasks, scored, mean reward, errors, truncated, mean turns (and, re-scored:
    the new mean reward and how many rewards changed)."""
    if index.is_empty():
        return []
    aggs = [pl.len().alias("rollouts"), pl.col("task_id").n_unique().alias("tasks"),
            pl.col("reward").is_not_null().sum().alias("scored"), pl.col("reward").mean().alias("mean_reward"),
            pl.col("error").is_not_null().mean().alias("errors"), pl.col("truncated").mean().alias("truncated"),
            pl.col("num_turns").mean().alias("mean_turns")]
    if "rescore_reward" in index.columns:
        aggs += [pl.col("rescore_reward").mean().alias("mean_new_reward"), changed_expr().sum().alias("changed")]
    return index.group_by("env").agg(aggs).sort("env").to_dicts()


@dataclass(frozen=True)
class Bar:
    low: float
    high: float
    count: int
    height: float  # 0..1 of the tallest bar


def histogram(index: pl.DataFrame, env: str, column: str = "reward") -> list[Bar]:
    """Reward counts of one env's scored rows in HIST_BINS equal bins over their range (one bar when every reward
    is the same)."""
    values = [v for v in index.filter(pl.col("env") == env)[column].drop_nulls().to_list() if math.isfinite(v)]
    if not values:
        return []
    low, high = min(values), max(values)
    if high - low < 1e-12:
        return [Bar(low, high, len(values), 1.0)]
    width = (high - low) / HIST_BINS
    counts = [0] * HIST_BINS
    for v in values:
        counts[min(int((v - low) / width), HIST_BINS - 1)] += 1
    top = max(counts)
    return [Bar(low + i * width, low + (i + 1) * width, c, c / top) for i, c in enumerate(counts)]


def choices(index: pl.DataFrame, column: str) -> list[str]:
    """The distinct values of a text column, for a filter's menu."""
    if index.is_empty():
        return []
    return sorted(v for v in index[column].unique().to_list() if v is not None)


def compare(a: pl.DataFrame, b: pl.DataFrame, number: int,
            size: int = PAGE_ROWS) -> tuple[list[dict[str, Any]], int, int]:
    """Tasks both runs sampled: per task the mean reward on each side and the difference, largest first. A re-scored
    run counts with its new rewards, so a run and its re-score compare what the new verifier changed."""
    def per_task(index: pl.DataFrame, side: str) -> pl.DataFrame:
        reward = pl.col("rescore_reward" if "rescore_reward" in index.columns else "reward")
        return index.group_by("env", "task_id").agg(reward.mean().alias(f"reward_{side}"),
                                                    pl.len().alias(f"samples_{side}"))

    if a.is_empty() or b.is_empty():
        return [], 0, 1
    joined = per_task(a, "a").join(per_task(b, "b"), on=["env", "task_id"], how="inner")
    joined = joined.with_columns((pl.col("reward_b") - pl.col("reward_a")).alias("delta"))
    joined = joined.sort(pl.col("delta").abs(), "env", "task_id", descending=[True, False, False], nulls_last=True)
    return _slice(joined, number, size)


def first_sample(index: pl.DataFrame, env: str, task_id: str) -> str | None:
    """The rollout id of a task's first sample in a run (None: the run did not sample it)."""
    found = index.filter((pl.col("env") == env) & (pl.col("task_id") == task_id)).sort("sample").head(1)
    return None if found.is_empty() else found["rollout_id"][0]
