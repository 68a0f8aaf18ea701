"""From a stream of rollout rows to complete GRPO groups with advantages, in bounded memory.

    stream = GroupStream([rows_a, rows_b], GroupSettings(n=8), env_weights={"arithmetic": 2.0, "wordle": 1.0})
    for group in stream:                          # Group(env, key, rows, advantages, weight)
        ...
    stream.counts                                 # dropped/skipped rows and groups, by reason

Rows arrive from any mix of sources (shards, Hub streams, the online producer), interleaved.
A group is complete when `n` rows share its `group` key; groups still incomplete when a source
ends, or pushed out of the buffer (`buffer_groups`), follow the short-group policy. Ready groups
wait in one queue per env, and the next group is drawn by env weight (seeded), so a mixture
trains in proportion whatever the order of the sources.

The stored token record is used as is (never re-tokenized); rows whose record cannot train
(lengths disagree, not prefix-consistent, failed, unscored) are skipped with a counted warning
naming env, rollout id and field, or raise in strict mode.
"""

from __future__ import annotations

import logging
import random
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from hubgym.errors import HubgymError

log = logging.getLogger("hubgym.train")


class BadRowError(HubgymError, ValueError):
    """A rollout row that cannot be trained on (strict mode); the message names env, rollout and field."""


@dataclass(frozen=True)
class GroupSettings:
    n: int = 8
    advantage: str = "grpo"  # grpo: (r - mean) / std; dr_grpo: r - mean
    zero_variance: str = "drop"  # drop | downweight | keep
    zero_variance_weight: float = 0.1
    short_groups: str = "drop"  # drop | keep | error
    truncated: str = "keep"  # keep | mask | zero
    strict: bool = False
    buffer_groups: int = 256


@dataclass
class Group:
    env: str
    key: str
    rows: list[dict[str, Any]]
    advantages: list[float]
    weight: float = 1.0
    loss_masked: list[bool] = field(default_factory=list)  # rows whose tokens get no gradient (truncation policy)


def check_row(row: dict[str, Any]) -> str | None:
    """The field that makes a row untrainable, or None."""
    n = len(row.get("completion_ids") or [])
    if row.get("error") is not None:
        return "error"
    if row.get("reward") is None:
        return "reward"
    if not row.get("prompt_ids") or n == 0:
        return "completion_ids"
    if len(row.get("completion_mask") or []) != n:
        return "completion_mask"
    if len(row.get("completion_logprobs") or []) != n:
        return "completion_logprobs"
    if row.get("tokens_consistent") is False:
        return "tokens_consistent"
    return None


def advantages(rewards: list[float], kind: str) -> list[float]:
    """Group-relative advantages: r - mean, divided by the (population) std for `grpo`."""
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if kind == "dr_grpo":
        return centred
    if kind != "grpo":
        raise ValueError(f"advantage is {kind!r}; use grpo or dr_grpo")
    std = (sum(c * c for c in centred) / len(centred)) ** 0.5
    return [c / (std + 1e-6) for c in centred]


class GroupStream:
    def __init__(self, sources: Iterable[Iterable[dict[str, Any]]], settings: GroupSettings,
                 env_weights: dict[str, float] | None = None, seed: int = 0):
        self.sources = [iter(s) for s in sources]
        self.settings, self.env_weights = settings, env_weights
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self._pending: OrderedDict[str, list[dict]] = OrderedDict()  # incomplete groups, oldest first
        self._ready: dict[str, deque[Group]] = {}
        self._known: set[str] = set()  # envs seen in the rows so far

    def __iter__(self) -> Iterator[Group]:
        while True:
            group = self.next_group()
            if group is None:
                return
            yield group

    def next_group(self) -> Group | None:
        """The next complete group, its env drawn by weight (seeded), or None when every source is done.

        The env is drawn first, then rows are read until that env has a ready group, so the mixture
        holds whatever the order of the rows; reading ahead stops at `buffer_groups` ready groups.
        """
        while True:
            if not self._known and self.sources:
                self._pull_round()
                continue
            candidates = sorted(e for e in self._known if self._ready.get(e) or self.sources or self._pending)
            if not candidates:
                return None
            weights = [self.env_weights.get(e, 1.0) if self.env_weights else 1.0 for e in candidates]
            env = self.rng.choices(candidates, weights=weights)[0]
            while not self._ready.get(env) and self.sources and self._ready_total() < self.settings.buffer_groups:
                self._pull_round()
            if not self._ready.get(env) and not self.sources:
                for key in list(self._pending):  # every source ended: what is left is short
                    self._close(key)
            if not self._ready.get(env):
                if self.sources:  # read-ahead limit hit: serve a ready env instead
                    env = self.rng.choices(self._ready_envs())[0]
                else:
                    self._known.discard(env)
                    continue
            self.counts["groups"] += 1
            return self._ready[env].popleft()

    def _ready_total(self) -> int:
        return sum(len(q) for q in self._ready.values())

    def _ready_envs(self) -> list[str]:
        return sorted(e for e, q in self._ready.items() if q)

    def _pull_round(self) -> None:
        """One row from each live source (round robin): sources interleave, none is read ahead."""
        for source in list(self.sources):
            row = next(source, None)
            if row is None:
                self.sources.remove(source)
                continue
            self._add(row)

    def _add(self, row: dict[str, Any]) -> None:
        env = row.get("env", "?")
        if self.env_weights is not None and env not in self.env_weights:
            self._bad(row, "env", f"env {env!r} is not in the training config's envs "
                                  f"({', '.join(sorted(self.env_weights))}); add it under `envs`")
            return
        bad = check_row(row)
        if bad:
            self._bad(row, bad, f"{bad} is unusable (error, missing reward, or a token record whose lengths "
                                f"disagree / is not prefix-consistent)")
            return
        self._known.add(env)
        key = row["group"]
        rows = self._pending.setdefault(key, [])
        rows.append(row)
        if len(rows) >= self.settings.n:
            self._finish(self._pending.pop(key))
        while len(self._pending) > self.settings.buffer_groups:  # bounded memory: the oldest group is short
            self._close(next(iter(self._pending)))

    def _bad(self, row: dict[str, Any], field_name: str, why: str) -> None:
        message = f"env {row.get('env')!r}, rollout {row.get('rollout_id')!r}, field {field_name!r}: {why}"
        if self.settings.strict:
            raise BadRowError(f"{message} (strict mode; set grpo.strict=false to skip such rows)")
        self.counts[f"skipped_rows/{field_name}"] += 1
        if self.counts[f"skipped_rows/{field_name}"] <= 3:
            log.warning("skipped a rollout row: %s", message)

    def _close(self, key: str) -> None:
        rows = self._pending.pop(key)
        policy = self.settings.short_groups
        if policy == "error":
            raise BadRowError(f"group {key!r} of env {rows[0].get('env')!r} has {len(rows)} rows, expected "
                              f"n={self.settings.n}; set grpo.short_groups to drop or keep")
        self.counts["short_groups"] += 1
        if policy == "keep" and len(rows) >= 2:
            self._finish(rows)
        else:
            self.counts["dropped_groups/short"] += 1

    def _finish(self, rows: list[dict[str, Any]]) -> None:
        s = self.settings
        rewards = [float(r["reward"]) for r in rows]
        weight = 1.0
        if max(rewards) - min(rewards) < 1e-9:
            self.counts["zero_variance_groups"] += 1
            if s.zero_variance == "drop":
                self.counts["dropped_groups/zero_variance"] += 1
                return
            weight = s.zero_variance_weight if s.zero_variance == "downweight" else 1.0
        adv = advantages(rewards, s.advantage)
        masked = [False] * len(rows)
        for i, row in enumerate(rows):
            if row.get("truncated"):
                self.counts["truncated_rows"] += 1
                if s.truncated == "zero":
                    adv[i] = 0.0
                masked[i] = s.truncated == "mask"
        env = rows[0].get("env", "?")
        self._ready.setdefault(env, deque()).append(Group(env, rows[0]["group"], rows, adv, weight, masked))
