"""check_held_out_apart: a held-out split shares no task with the training split.

A task is its prompt and its info (what the model reads and what the verifier scores against); a row of "test"
with the prompt and info of a row of "train" is a question the policy was trained on, so held-out rewards would
measure memory. Ids cannot tell: they hash the interaction too, and an env is free to give a held-out row other
limits. Every split other than "train" is held out, except in a config the builder lists in SHARED_SPLITS, with
why (a demo that measures how a model fits the very tasks it trains on).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from hubgym.conformance.common import fail
from hubgym.schemas import Task

if TYPE_CHECKING:
    from hubgym.conformance.context import Context

TRAIN = "train"


def task_key(row: Task) -> str:
    """A row's task as text: its prompt and info, canonical JSON."""
    return json.dumps([row["prompt"], row["info"]], sort_keys=True, default=repr)


def check_held_out_apart(ctx: Context) -> None:
    """No row of a split other than "train" has the prompt and info of a row of "train" (same config), unless the
    builder declares the config's splits shared on purpose (TaskBuilder.SHARED_SPLITS)."""
    for config in ctx.configs:
        built = ctx.build(config)
        if TRAIN not in built or config in ctx.builder.SHARED_SPLITS:
            continue
        train = {task_key(row): row["id"] for row in ctx.rows(config, TRAIN)}
        for split in built:
            if split == TRAIN:
                continue
            rows = ctx.rows(config, split)
            shared = [(row, train[task_key(row)]) for row in rows if task_key(row) in train]
            if shared:
                row, twin = shared[0]
                fail(f"{len(shared)} of the {len(rows)} tasks of split {split!r} are also in 'train' (row "
                     f"{row['id']!r} has the prompt and info of train row {twin!r}); a held-out split that shares "
                     f"tasks with the training split measures what the policy memorized, not what it learned",
                     ctx.where(config, split, row["id"], "info"),
                     "draw held-out tasks apart from train's: leave out what train holds, or assign each task to one "
                     "split by a hash of its content (e.g. hashlib.sha256(key) % 5 == 0 goes to test)")
