"""One GRPO group: which rows can train, group-relative advantages, zero-variance and truncation policies.

    settings = GroupSettings(n=8, advantage="grpo", zero_variance="downweight")
    bad_field(row)                                   # "completion_mask" if the token record's lengths disagree
    group = make_group(rows, settings, counts)       # Group(env, key, rows, advantages, weight, ...) or None
    stale, lag = mask_stale(groups, version=step, max_staleness=2)   # online rows sampled too long ago

The stream (stream.py) decides *which* rows form a group; this module decides what a complete
group trains with. Only stored values are used (rewards, ids, masks, behaviour logprobs): nothing
is re-tokenized or re-scored here.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hubgym.schemas.row_contract import row_breach
from hubgym.train.config import ConfigError

ADVANTAGES = ("grpo", "dr_grpo")
ZERO_VARIANCE = ("drop", "downweight", "keep")
SHORT_GROUPS = ("drop", "keep", "error")
TRUNCATED = ("keep", "mask", "zero")
UNKNOWN_ENV = ("skip", "error")
OBJECTIVES = ("grpo", "sft")


@dataclass(frozen=True)
class GroupSettings:
    n: int = 8  # samples per group: a group is complete when n rows share its `group` key
    advantage: str = "grpo"  # grpo: (r - mean) / std; dr_grpo: r - mean (Dr. GRPO drops the std)
    zero_variance: str = "drop"  # groups whose rewards are all equal: drop | downweight | keep
    zero_variance_weight: float = 0.1  # their share of the loss's divisors when "downweight" (advantages are 0)
    short_groups: str = "drop"  # fewer than n rows when the source ends or the buffer is full: drop | keep | error
    truncated: str = "keep"  # truncated completions: keep | mask (no loss token) | zero (advantage 0)
    strict: bool = False  # a bad row or an unknown env raises BadRowError instead of being skipped and counted
    buffer_groups: int = 256  # memory bound: incomplete groups held (and ready groups read ahead) at most
    unknown_env: str = "skip"  # rows of an env outside the configured mixture: skip (counted) | error
    # grpo: group-relative advantages against the stored behaviour logprobs. sft: each row's sampled tokens train by
    # likelihood, so a group of any size and rewards trains (no advantage) and behaviour logprobs are not needed.
    objective: str = "grpo"

    def __post_init__(self) -> None:
        for name, allowed in (("advantage", ADVANTAGES), ("zero_variance", ZERO_VARIANCE),
                              ("short_groups", SHORT_GROUPS), ("truncated", TRUNCATED), ("unknown_env", UNKNOWN_ENV),
                              ("objective", OBJECTIVES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"grpo.{name} is {getattr(self, name)!r}; use one of {', '.join(allowed)}")
        if self.n < 1 or self.buffer_groups < 1:
            raise ConfigError(f"grpo.n={self.n} and batch.buffer_groups={self.buffer_groups} must both be >= 1")
        if self.zero_variance_weight < 0:
            raise ConfigError(f"grpo.zero_variance_weight={self.zero_variance_weight} must be >= 0")


@dataclass
class Group:
    env: str
    key: str
    rows: list[dict[str, Any]]
    advantages: list[float]
    weight: float = 1.0  # sequence weight of every row (zero-variance down-weighting; see loss.py)
    loss_masked: list[bool] = field(default_factory=list)  # rows whose tokens get no gradient (truncation policy)
    refs: list[tuple[int, int]] = field(default_factory=list)  # (source, row position) of each row: for resume
    objective: str = "grpo"  # how its rows train: grpo (advantages) or sft (likelihood; advantages unused)

    def keep(self, keep: list[bool]) -> "Group":
        """This group with only the rows where `keep` is true; advantages stay those of the whole group."""
        def kept(values: list) -> list:
            return [v for v, k in zip(values, keep) if k] if values else values
        return Group(self.env, self.key, kept(self.rows), kept(self.advantages), self.weight, kept(self.loss_masked),
                     kept(self.refs), self.objective)


def bad_field(row: dict[str, Any], objective: str = "grpo") -> str | None:
    """The field that makes a row untrainable, or None. Under `sft` a row without behaviour logprobs trains.

    Order matters only for the message: a row that breaks the row contract (hubgym.schemas.row_contract: no
    hubgym writer writes it; shard readers refuse it) is reported by the rule's column first, then a failed row as
    `error` even if its reward is null.
    """
    breach = row_breach(row)
    if breach is not None:
        return breach.column
    n = len(row.get("completion_ids") or [])
    if row.get("error") is not None:
        return "error"
    reward = row.get("reward")
    if reward is None or not math.isfinite(reward):
        return "reward"
    if not row.get("group"):
        return "group"
    if not row.get("prompt_ids"):
        return "prompt_ids"
    if n == 0:
        return "completion_ids"
    if len(row.get("completion_mask") or []) != n:
        return "completion_mask"
    logprobs = len(row.get("completion_logprobs") or [])
    if logprobs != n and not (objective == "sft" and logprobs == 0):
        return "completion_logprobs"
    if row.get("tokens_consistent") is False:
        return "tokens_consistent"
    return None




def advantages(rewards: list[float], kind: str, eps: float = 1e-6) -> list[float]:
    """Group-relative advantages: r - mean, divided by the population std (+ eps) for `grpo`.

    `dr_grpo` leaves the std out: dividing by it up-weights groups whose rewards barely differ
    (Dr. GRPO, Liu et al. 2025, section 3.1).
    """
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if kind == "dr_grpo":
        return centred
    if kind != "grpo":
        raise ValueError(f"advantage is {kind!r}; use one of {', '.join(ADVANTAGES)}")
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + eps) for c in centred]


def make_group(rows: list[dict[str, Any]], settings: GroupSettings, counts: Counter[str],
               refs: list[tuple[int, int]] | None = None) -> Group | None:
    """A trainable group from complete (or kept short) rows, or None when the zero-variance policy drops it."""
    rewards = [float(r["reward"]) for r in rows]
    weight = 1.0
    if settings.objective == "sft":  # likelihood of each row's tokens: no group-relative signal needed
        return Group(rows[0].get("env") or "?", rows[0]["group"], rows, [0.0] * len(rows), 1.0,
                     [settings.truncated == "mask" and bool(r.get("truncated")) for r in rows], list(refs or []),
                     "sft")
    if max(rewards) - min(rewards) < 1e-9:  # every sample scored the same: no relative signal
        counts["zero_variance_groups"] += 1
        if settings.zero_variance == "drop":
            counts["dropped_groups/zero_variance"] += 1
            return None
        if settings.zero_variance == "downweight":
            weight = settings.zero_variance_weight
    adv = advantages(rewards, settings.advantage)
    masked = [False] * len(rows)
    for i, row in enumerate(rows):
        if row.get("truncated"):
            counts["truncated_rows"] += 1
            if settings.truncated == "zero":
                adv[i] = 0.0
            masked[i] = settings.truncated == "mask"
    return Group(rows[0].get("env") or "?", rows[0]["group"], rows, adv, weight, masked, list(refs or []))


def policy_version(row: dict[str, Any]) -> int:
    return (row.get("provenance") or {}).get("policy_version") or 0


def mask_stale(groups: list[Group], version: int, max_staleness: int | None) -> tuple[int, int]:
    """Give no loss token to rows sampled more than `max_staleness` policy versions before `version`; returns
    (rows masked, the largest lag seen). The rows stay in their groups' advantages, as truncated rows do.

    For the trainer's own online rows only: a stored rollout's policy_version counts the versions of the run
    that sampled it, not this one's; stored rows are off-policy by design, and the loss's importance weight
    against their behaviour logprobs is what corrects them.
    """
    masked, largest = 0, 0
    for group in groups:
        if not group.loss_masked:
            group.loss_masked = [False] * len(group.rows)
        for i, row in enumerate(group.rows):
            lag = version - policy_version(row)
            largest = max(largest, lag)
            if max_staleness is not None and lag > max_staleness and not group.loss_masked[i]:
                group.loss_masked[i] = True
                masked += 1
    return masked, largest

