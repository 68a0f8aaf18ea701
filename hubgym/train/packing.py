"""One optimizer step's groups -> token-budgeted micro-batches per rank (the layout is in batch.py).

    groups = take_step(stream, groups=8)                 # or sequences=64: whole groups, in stream order
    shares = pack_step(groups, max_tokens=4096, world_size=2)
    shares[rank]                                          # this rank's micro-batches (same count on every rank)

Padding-free where it can be: a micro-batch is rows as wide as its longest sequence, and a row holds
as many sequences back to back as fit (position ids restart with each; the model keeps attention
within each). Sequences are placed longest first, each into the first row with room (first-fit
decreasing), else into a new row of a micro-batch still under `max_tokens` (rows x width, padding
included), else into a new micro-batch as wide as itself. So the short rollouts of a step fill the
room the long ones leave, and a micro-batch computes no more attention than one sequence per
padded row would (each row's width is never above its longest sequence's).

Micro-batches are dealt to ranks longest-first to the least-loaded rank (ties: the lower rank) among
those still under ceil(M / world_size), so the split is deterministic, balanced in padded tokens,
and costs no extra pass; a rank with fewer micro-batches gets empty ones (no loss token), because
every rank must run the same number of forward/backward passes.

Every micro-batch carries the counts of the whole step (all ranks): `num_sequences` (sequences
with at least one loss token) and `num_tokens` (loss tokens), each sequence counted by its group's
weight (1, or the zero-variance weight). The losses divide by them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from hubgym.errors import SequenceTooLongError
from hubgym.train.batch import MicroBatch
from hubgym.train.groups import Group



class Item(NamedTuple):
    """One sequence to place: a row and what its group says of it."""

    row: dict[str, Any]
    advantage: float
    weight: float
    masked: bool  # no loss token (truncation or staleness policy)
    env: str
    sft: bool  # trains by likelihood (offline.loss sft), not by its advantage


def take_step(stream, *, groups: int | None = None, sequences: int | None = None) -> list[Group]:
    """The next step's groups from a GroupStream: `groups` whole groups, or whole groups until at least
    `sequences` rows. Fewer (possibly none) when the stream ends."""
    if (groups is None) == (sequences is None):
        raise ValueError("take_step needs exactly one of groups= or sequences=")
    taken: list[Group] = []
    while (len(taken) < groups) if groups is not None else (sum(len(g.rows) for g in taken) < sequences):
        group = stream.next_group()
        if group is None:
            break
        taken.append(group)
    return taken


def sequence_length(row: dict[str, Any]) -> int:
    return len(row["prompt_ids"]) + len(row["completion_ids"])


def pack_step(groups: list[Group], max_tokens: int, world_size: int = 1, pad_id: int = 0) -> list[list[MicroBatch]]:
    """One step: a list of micro-batches for each rank (the same number on every rank)."""
    items = [Item(row, adv, g.weight, masked, g.env, g.objective == "sft") for g in groups
             for row, adv, masked in zip(g.rows, g.advantages, g.loss_masked or [False] * len(g.rows))]
    for row, *_, env, _ in items:
        if sequence_length(row) > max_tokens:
            raise SequenceTooLongError(
                f"rollout {row.get('rollout_id')!r} of env {env!r} has {sequence_length(row)} tokens (prompt + "
                f"completion), more than the micro-batch budget batch.micro_batch_tokens={max_tokens}; raise the "
                f"budget to at least the longest sequence (prompt length + max generated tokens)")
    trainable = [(loss_tokens(item.row, item.masked), item.weight) for item in items]
    num_sequences = sum(weight for tokens, weight in trainable if tokens > 0)
    num_tokens = sum(weight * tokens for tokens, weight in trainable)
    plans = plan_rows([sequence_length(item[0]) for item in items], max_tokens)
    batches = [collate([[items[i] for i in row] for row in plan.rows], plan.width, num_sequences, num_tokens, pad_id)
               for plan in plans]
    ranks = deal(batches, [len(plan.rows) * plan.width for plan in plans], world_size)
    per_rank = max(1, max(map(len, ranks)))
    for share in ranks:
        share += [empty_batch(num_sequences, num_tokens, pad_id) for _ in range(per_rank - len(share))]
    return ranks


@dataclass
class Plan:
    """One micro-batch's layout: rows of `width` tokens, each a list of sequence indices, back to back."""

    width: int
    rows: list[list[int]] = field(default_factory=list)
    free: list[int] = field(default_factory=list)  # room left in each row


def plan_rows(lengths: list[int], max_tokens: int) -> list[Plan]:
    """First-fit decreasing (see above); equal lengths keep their order, so the layout is deterministic."""
    plans: list[Plan] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        length = lengths[i]
        row = next(((plan, r) for plan in plans for r, free in enumerate(plan.free) if free >= length), None)
        if row is not None:
            plan, r = row
            plan.rows[r].append(i)
            plan.free[r] -= length
            continue
        plan = next((p for p in plans if (len(p.rows) + 1) * p.width <= max_tokens), None)
        if plan is None:
            plan = Plan(width=length)  # sorted: the longest yet to place, so it sets the new micro-batch's width
            plans.append(plan)
        plan.rows.append([i])
        plan.free.append(plan.width - length)
    return plans


def loss_tokens(row: dict[str, Any], masked: bool) -> int:
    return 0 if masked else int(sum(row["completion_mask"]))


def deal(batches: list[MicroBatch], costs: list[int], world_size: int) -> list[list[MicroBatch]]:
    """Longest first to the least-loaded rank that has fewer than ceil(M / world_size) micro-batches, so no
    rank runs more passes than it must (each pass of ZeRO-3 gathers every parameter); each rank keeps its
    micro-batches in packing order."""
    capacity = max(1, -(-len(batches) // world_size))
    load, owned = [0] * world_size, [[] for _ in range(world_size)]
    for i in sorted(range(len(batches)), key=lambda i: -costs[i]):
        rank = min((r for r in range(world_size) if len(owned[r]) < capacity), key=lambda r: (load[r], r))
        load[rank] += costs[i]
        owned[rank].append(i)
    return [[batches[i] for i in sorted(mine)] for mine in owned]


def collate(rows: list[list[Item]], width: int, num_sequences: float, num_tokens: float,
            pad_id: int = 0) -> MicroBatch:
    """Rows of `width` tokens, each its sequences back to back (prompt then completion, straight from the stored
    token record), then padding. Per-sequence values are in placement order, row by row."""
    shape = (len(rows), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)  # (B, T)
    attention = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    old = torch.zeros(shape, dtype=torch.float32)
    positions = torch.zeros(shape, dtype=torch.long)
    sequence = torch.zeros(shape, dtype=torch.long)
    placed = [item for row in rows for item in row]
    index = 0
    for r, row in enumerate(rows):
        at = length = 0
        for item in row:
            item_row, masked = item.row, item.masked
            p, c = len(item_row["prompt_ids"]), len(item_row["completion_ids"])
            length = p + c
            ids[r, at:at + length] = torch.tensor(item_row["prompt_ids"] + item_row["completion_ids"])
            attention[r, at:at + length] = 1
            if not masked:
                loss_mask[r, at + p:at + length] = torch.tensor(item_row["completion_mask"], dtype=torch.float32)
            loss_mask[r, at] = 0.0  # a sequence's first token has no logit of its own sequence before it
            if item_row["completion_logprobs"]:  # an sft row may have none (an imported run): 0 then
                old[r, at + p:at + length] = (torch.tensor(item_row["completion_logprobs"], dtype=torch.float32)
                                              * loss_mask[r, at + p:at + length])
            positions[r, at:at + length] = torch.arange(length)
            sequence[r, at:at + length] = index
            at, index = at + length, index + 1
        positions[r, at:] = torch.arange(length, length + width - at)  # padding continues the last sequence
        sequence[r, at:] = index - 1
    packed = any(len(row) > 1 for row in rows)
    return MicroBatch(
        input_ids=ids, attention_mask=attention, loss_mask=loss_mask, old_logprobs=old,
        advantages=torch.tensor([item.advantage for item in placed], dtype=torch.float32),
        weights=torch.tensor([item.weight for item in placed], dtype=torch.float32),
        sft=torch.tensor([item.sft for item in placed]) if any(item.sft for item in placed) else None,
        position_ids=positions if packed else None, sequence_index=sequence,
        num_sequences=num_sequences, num_tokens=num_tokens,
        rollout_ids=[item.row.get("rollout_id", "") for item in placed], envs=[item.env for item in placed]
    ).with_loss_index()


def empty_batch(num_sequences: float, num_tokens: float, pad_id: int = 0) -> MicroBatch:
    """A two-token micro-batch with no loss token: keeps a rank's pass count in step with the others."""
    zero = torch.zeros((1, 2), dtype=torch.float32)
    return MicroBatch(input_ids=torch.full((1, 2), pad_id, dtype=torch.long),
                      attention_mask=torch.ones((1, 2), dtype=torch.long), loss_mask=zero, old_logprobs=zero.clone(),
                      advantages=torch.zeros(1), weights=torch.zeros(1), num_sequences=num_sequences,
                      num_tokens=num_tokens).with_loss_index()
