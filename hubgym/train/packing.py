"""Pack one optimizer step's groups into token-budgeted micro-batches (see batch.py for the layout).

Sequences are sorted by length so each micro-batch pads little, then cut greedily so that
rows x padded length stays within `max_tokens`. With several ranks, micro-batches are dealt
round robin and the short ranks get an empty micro-batch (no loss token), because every rank must
run the same number of backward passes. Global counts go into every micro-batch.
"""

from __future__ import annotations

import torch

from hubgym.train.batch import MicroBatch
from hubgym.train.groups import Group


def pack_step(groups: list[Group], max_tokens: int, world_size: int = 1, pad_id: int = 0) -> list[list[MicroBatch]]:
    """One step: a list of micro-batches for each rank (same count on every rank)."""
    rows = [(row, adv, g.weight, masked, g.env) for g in groups
            for row, adv, masked in zip(g.rows, g.advantages, g.loss_masked or [False] * len(g.rows))]
    rows.sort(key=lambda r: len(r[0]["prompt_ids"]) + len(r[0]["completion_ids"]))
    chunks: list[list] = []
    for item in rows:
        length = len(item[0]["prompt_ids"]) + len(item[0]["completion_ids"])
        if chunks and (len(chunks[-1]) + 1) * length <= max_tokens:  # sorted: this row is the longest so far
            chunks[-1].append(item)
        else:
            chunks.append([item])
    num_tokens = sum(0 if m else sum(r["completion_mask"]) for r, _, _, m, _ in rows)
    batches = [_collate(chunk, len(rows), num_tokens, pad_id) for chunk in chunks]
    per_rank = max(1, -(-len(batches) // world_size))
    ranks = [batches[r::world_size] for r in range(world_size)]
    for share in ranks:
        share += [_empty(len(rows), num_tokens, pad_id)] * (per_rank - len(share))
    return ranks


def _collate(items: list, num_sequences: int, num_tokens: int, pad_id: int) -> MicroBatch:
    width = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r, *_ in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
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
        advantages=torch.tensor([a for _, a, *_ in items], dtype=torch.float32),
        policy_version=torch.tensor([(r.get("provenance") or {}).get("policy_version") or 0 for r, *_ in items]),
        weights=torch.tensor([w for _, _, w, _, _ in items], dtype=torch.float32),
        num_sequences=num_sequences, num_tokens=num_tokens,
        rollout_ids=[r.get("rollout_id", "") for r, *_ in items], envs=[e for *_, e in items])


def _empty(num_sequences: int, num_tokens: int, pad_id: int) -> MicroBatch:
    """A one-token micro-batch with no loss token: keeps a rank's backward count in step with the others."""
    zero = torch.zeros((1, 2), dtype=torch.float32)
    return MicroBatch(input_ids=torch.full((1, 2), pad_id, dtype=torch.long), attention_mask=torch.ones((1, 2),
                      dtype=torch.long), loss_mask=zero, old_logprobs=zero.clone(), advantages=torch.zeros(1),
                      policy_version=torch.zeros(1, dtype=torch.long), weights=torch.zeros(1),
                      num_sequences=num_sequences, num_tokens=num_tokens)
