"""hubgym's readers with the checks of hubgym.hub.shard_checks switched off, in this process: how the readers
read before every batch of every shard was checked (what a benchmark compares the checked reading against).

    with checks_off():
        rescore(run, workers=1)        # in this process only: a worker process has its own, checking, modules

The sha256, Arrow structure, schema and row count are still checked, as they were before; off are the full
validation of each batch and the row contract (shard_checks.ShardCheck), the non-finite rewards read as errors
(as_read) and the rollout ids repeated across shards (SeenRollouts).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class _Unchecked:
    """ShardCheck's shape, checking nothing."""

    def __init__(self, shard: str, **kwargs) -> None:
        self.ids: set[str] = set()

    def batch(self, batch, first_row: int) -> None:
        pass

    def finish(self) -> None:
        pass


@contextmanager
def checks_off() -> Iterator[None]:
    from hubgym.hub import shard_checks, shards
    from hubgym.schemas.rollouts import upgrade_batch

    saved = shards.ShardCheck, shards.as_read, shard_checks.SeenRollouts.add
    shards.ShardCheck = _Unchecked
    shards.as_read = upgrade_batch
    shard_checks.SeenRollouts.add = lambda self, shard, ids: None
    try:
        yield
    finally:
        shards.ShardCheck, shards.as_read, shard_checks.SeenRollouts.add = saved
