"""One optimizer step's groups -> token-budgeted micro-batches per rank (the layout is in batch.py).

    groups = take_step(stream, groups=8)                 # or sequences=64: whole groups, in stream order
    shares = pack_step(groups, max_tokens=4096, world_size=2)
    shares[rank]                                          # this rank's micro-batches (same count on every rank)

Sequences are sorted by length so that each micro-batch pads little, then cut greedily so that
rows x padded length stays within `max_tokens` (padding included). Micro-batches are dealt to
ranks longest-first to the least-loaded rank (ties: the lower rank) among those still under
ceil(M / world_size), so the split is deterministic, balanced in padded tokens, and costs no extra
pass; a rank with fewer micro-batches gets empty ones (no loss token), because every rank must
run the same number of forward/backward passes.

Every micro-batch carries the counts of the whole step (all ranks): `num_sequences` (sequences
with at least one loss token) and `num_tokens` (loss tokens), each sequence counted by its group's
weight (1, or the zero-variance weight). The losses divide by them.
"""

from __future__ import annotations

from typing import Any

import torch

from hubgym.errors import SequenceTooLongError
from hubgym.train.batch import MicroBatch
from hubgym.train.groups import Group

Item = tuple[dict[str, Any], float, float, bool, str]  # (row, advantage, weight, loss masked, env)


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
    items: list[Item] = [(row, adv, g.weight, masked, g.env) for g in groups
                         for row, adv, masked in zip(g.rows, g.advantages, g.loss_masked or [False] * len(g.rows))]
    for row, *_, env in items:
        if sequence_length(row) > max_tokens:
            raise SequenceTooLongError(
                f"rollout {row.get('rollout_id')!r} of env {env!r} has {sequence_length(row)} tokens (prompt + "
                f"completion), more than the micro-batch budget batch.micro_batch_tokens={max_tokens}; raise the "
                f"budget to at least the longest sequence (prompt length + max generated tokens)")
    items.sort(key=lambda item: sequence_length(item[0]))  # stable: equal lengths keep group order
    chunks: list[list[Item]] = []
    for item in items:
        # sorted: this row is the longest so far, so the padded size of the chunk is rows x its length
        if chunks and (len(chunks[-1]) + 1) * sequence_length(item[0]) <= max_tokens:
            chunks[-1].append(item)
        else:
            chunks.append([item])
    trainable = [(loss_tokens(row, masked), weight) for row, _, weight, masked, _ in items]
    num_sequences = sum(weight for tokens, weight in trainable if tokens > 0)
    num_tokens = sum(weight * tokens for tokens, weight in trainable)
    batches = [collate(chunk, num_sequences, num_tokens, pad_id) for chunk in chunks]
    ranks = deal(batches, [len(c) * sequence_length(c[-1][0]) for c in chunks], world_size)
    per_rank = max(1, max(map(len, ranks)))
    for share in ranks:
        share += [empty_batch(num_sequences, num_tokens, pad_id) for _ in range(per_rank - len(share))]
    return ranks


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


def collate(items: list[Item], num_sequences: float, num_tokens: float, pad_id: int = 0) -> MicroBatch:
    """Right-padded rows, prompt then completion, straight from the stored token record."""
    width = max(sequence_length(row) for row, *_ in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)  # (B, T)
    attention = torch.zeros((len(items), width), dtype=torch.long)
    loss_mask = torch.zeros((len(items), width), dtype=torch.float32)
    old = torch.zeros((len(items), width), dtype=torch.float32)
    for i, (row, _, _, masked, _) in enumerate(items):
        p, c = len(row["prompt_ids"]), len(row["completion_ids"])
        ids[i, :p + c] = torch.tensor(row["prompt_ids"] + row["completion_ids"])
        attention[i, :p + c] = 1
        if not masked:
            loss_mask[i, p:p + c] = torch.tensor(row["completion_mask"], dtype=torch.float32)
        old[i, p:p + c] = torch.tensor(row["completion_logprobs"], dtype=torch.float32) * loss_mask[i, p:p + c]
    return MicroBatch(
        input_ids=ids, attention_mask=attention, loss_mask=loss_mask, old_logprobs=old,
        advantages=torch.tensor([adv for _, adv, *_ in items], dtype=torch.float32),
        weights=torch.tensor([w for _, _, w, _, _ in items], dtype=torch.float32),
        num_sequences=num_sequences, num_tokens=num_tokens,
        rollout_ids=[row.get("rollout_id", "") for row, *_ in items], envs=[env for *_, env in items])


def empty_batch(num_sequences: float, num_tokens: float, pad_id: int = 0) -> MicroBatch:
    """A two-token micro-batch with no loss token: keeps a rank's pass count in step with the others."""
    zero = torch.zeros((1, 2), dtype=torch.float32)
    return MicroBatch(input_ids=torch.full((1, 2), pad_id, dtype=torch.long),
                      attention_mask=torch.ones((1, 2), dtype=torch.long), loss_mask=zero, old_logprobs=zero.clone(),
                      advantages=torch.zeros(1), weights=torch.zeros(1), num_sequences=num_sequences, num_tokens=num_tokens)
