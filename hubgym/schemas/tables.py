"""Rows <-> Arrow tables, through the datasets features (which encode `info` dicts as JSON)."""

from __future__ import annotations

from typing import Iterable

import pyarrow as pa

from hubgym.schemas.rollouts import ROLLOUT_FEATURES, ROLLOUT_SCHEMA, Rollout
from hubgym.schemas.tasks import TASK_FEATURES, TASK_SCHEMA, Task


def tasks_to_table(rows: Iterable[Task]) -> pa.Table:
    return pa.Table.from_pylist([TASK_FEATURES.encode_example(r) for r in rows], schema=TASK_SCHEMA)


def rollouts_to_table(rows: Iterable[Rollout]) -> pa.Table:
    return pa.Table.from_pylist([ROLLOUT_FEATURES.encode_example(r) for r in rows], schema=ROLLOUT_SCHEMA)
