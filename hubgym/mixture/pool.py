"""Lazy per-env task sources and the LRU pool that bounds how many are open.

    pool = SourcePool(opener, max_open=64)
    row = pool.row(env_config, Position(epoch=0, pos=17))      # the 18th row of epoch 0, in shuffled order

A source never materializes its split: its rows come from the env's one data path (hubgym.envs.OpenedEnv.rows:
a builder's own generator, every row checked as a build checks it, or a hub env's Parquet files, streamed);
no datasets cache is written per env. Rows are served in blocks of `block` rows, each block
shuffled by a seed of its own, so position (epoch, pos) names one row whatever happened before: a source
evicted from the pool, or a resumed run, reopens and skips to the block that holds it (time linear in pos,
memory one block). Memory: at most `max_open` open sources, each holding one block of rows and its generator
(whose own state, e.g. the ids it has yielded, grows with that env's position, never with other envs).

Cost of the bound: a source evicted and opened again regenerates the rows before its position (a builder's
generator cannot seek), so drawing is fastest when `max_open` covers the env configs that carry most weight;
in training (tens of draws per step) that cost is small next to a step.
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hubgym.errors import EnvContractError, Where

__all__ = ["OpenSource", "Position", "SourcePool"]

BLOCK_ROWS = 32  # rows shuffled together: the memory of one open source, and the reach of its local shuffle
MAX_OPEN = 256  # open sources at once (an LRU): memory stays flat however many env configs a mixture has


@dataclass
class Position:
    """Where an env config's stream stands: `pos` rows of epoch `epoch` consumed (the next row is `pos`)."""

    epoch: int = 0
    pos: int = 0

    def to_list(self) -> list[int]:
        return [self.epoch, self.pos]


class OpenSource:
    """One env config's rows, epoch after epoch, each epoch in a block-shuffled order fixed by (seed, key)."""

    def __init__(self, key: str, rows: Callable[[], Iterator[dict]], seed: int, block: int = BLOCK_ROWS):
        self.key, self._rows, self._seed, self._block_rows = key, rows, seed, block
        self._iter: Iterator[dict] | None = None
        self._epoch, self._read = -1, 0  # the epoch the iterator walks, and rows read from it so far
        self._block: list[dict] = []
        self._block_at: tuple[int, int] | None = None  # (epoch, block index) held in _block
        self.epoch_rows: int | None = None  # rows per epoch, known once an epoch has run out

    def row(self, at: Position) -> dict | None:
        """The row at `at`, or None when `at.pos` is past the end of the epoch (the caller moves on to the next
        epoch). An env whose split yields no row at all is an error."""
        index, offset = divmod(at.pos, self._block_rows)
        if self._block_at != (at.epoch, index):
            self._load_block(at.epoch, index)
        if offset < len(self._block):
            return self._block[offset]
        if self.epoch_rows == 0:
            raise EnvContractError(f"mixture env config {self.key!r} yields no rows", Where(env=self.key),
                                   "give it a split with rows (or leave it out of the mixture)")
        return None

    def _load_block(self, epoch: int, index: int) -> None:
        start = index * self._block_rows
        if self._iter is None or self._epoch != epoch or self._read > start:
            self.close()
            self._iter, self._epoch, self._read = self._rows(), epoch, 0
        if self._read < start:  # skip to the block: a resumed or evicted source pays time, not memory
            self._read += sum(1 for _ in itertools.islice(self._iter, start - self._read))
        block = list(itertools.islice(self._iter, self._block_rows))
        self._read += len(block)
        if len(block) < self._block_rows:
            self.epoch_rows = self._read
        random.Random(f"{self._seed}:{self.key}:{epoch}:{index}").shuffle(block)
        self._block, self._block_at = block, (epoch, index)

    def close(self) -> None:
        close = getattr(self._iter, "close", None)
        if close is not None:
            close()
        self._iter = None


class SourcePool:
    """At most `max_open` OpenSources, least recently used evicted first; `opens` counts every open."""

    def __init__(self, opener: Callable[[Any], Callable[[], Iterator[dict]]], seed: int, max_open: int = MAX_OPEN,
                 block: int = BLOCK_ROWS, block_of: Callable[[Any], int] | None = None):
        if max_open < 1:
            raise ValueError(f"max_open={max_open}: keep at least one source open")
        self._opener, self._seed, self.max_open, self._block = opener, seed, max_open, block
        self._block_of = block_of  # an env config's own block size (1: rows already in random order)
        self._open: OrderedDict[str, OpenSource] = OrderedDict()
        self.opens = 0
        self.most_open = 0  # the largest number open at once (the memory bound's witness)

    def source(self, env: Any) -> OpenSource:
        found = self._open.get(env.key)
        if found is not None:
            self._open.move_to_end(env.key)
            return found
        while len(self._open) >= self.max_open:
            self._open.popitem(last=False)[1].close()
        rows = self._opener(env)
        opened = OpenSource(env.key, rows, self._seed, self._block_of(env) if self._block_of else self._block)
        self._open[env.key] = opened
        self.opens += 1
        self.most_open = max(self.most_open, len(self._open))
        return opened

    def open_count(self) -> int:
        return len(self._open)

    def close(self) -> None:
        for source in self._open.values():
            source.close()
        self._open.clear()
