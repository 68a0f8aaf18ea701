"""The learning-rate schedule: linear warmup, then constant, linear or cosine decay to a floor.

    factor = lr_factor(step, Schedule("cosine", warmup_steps=10, total_steps=100, min_lr_ratio=0.1))
    scheduler = make_scheduler(optimizer, schedule)   # a torch LambdaLR handed to deepspeed.initialize

The factor multiplies the peak `optim.lr`. It is a pure function of the number of optimizer updates
applied so far, so the scheduler's whole state is that count: DeepSpeed saves it in every checkpoint
(`lr_scheduler`) and a resumed run continues the curve exactly. DeepSpeed advances the scheduler only
when an update was applied, so a skipped step (non-finite loss or gradient) does not use up schedule.

Warmup goes from lr/warmup_steps at the first update to the full lr at update `warmup_steps` (the first
update never runs at lr 0, which would waste a step of rollouts). Decay spans the updates after warmup
up to `total_steps`, ending at `min_lr_ratio * lr`; past `total_steps` (a run extended) the floor holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class Schedule:
    kind: str = "constant"  # constant | linear | cosine
    warmup_steps: int = 0
    total_steps: int = 0  # optimizer steps of the whole run (decay ends there)
    min_lr_ratio: float = 0.0  # the decay's floor, as a fraction of the peak lr


def lr_factor(step: int, schedule: Schedule) -> float:
    """The lr multiplier for the update that follows `step` applied updates (0-based)."""
    warmup = schedule.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if schedule.kind == "constant":
        return 1.0
    span = max(1, schedule.total_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    floor = schedule.min_lr_ratio
    if schedule.kind == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * shape


def make_scheduler(optimizer: torch.optim.Optimizer, schedule: Schedule) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over `optimizer` (its state_dict is the step count, saved and restored by DeepSpeed)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, schedule))
