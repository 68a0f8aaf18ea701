"""One bounded, seeded, resumable stream of tasks over any number of env configs.

    mix = Mixture.from_spec(load_mix_spec("mix.yaml"), split="train", seed=0)
    batch = mix.take(64)                 # [Drawn(env=EnvConfig, task=row), ...]; no task twice in one batch
    state = mix.state()                  # JSON: {"draws": 64, "positions": {"arithmetic:easy": [0, 12], ...}}
    Mixture.from_spec(...).restore(state).take(64)   # exactly what the uninterrupted stream draws next

The draw. Draw number i picks its env config with `random.Random(f"{seed}:{i}")`, by weight (a bisection over
the cumulative weights): a pure function of (seed, i), whatever came before. The task is the next row of that
env config's own stream, which walks its split epoch after epoch in a block-shuffled order fixed by (seed,
env config, epoch) (see `hubgym.mixture.pool`). A row the filter does not keep, or one already in the
batch, is passed over and consumed. So the whole stream is fixed by the seed and the state below.

State and its size. `draws` (one int) plus, for every env config drawn at least once, its position (epoch,
rows consumed): about 40 bytes of JSON per env config ever drawn, nothing per row. Restoring it reopens each
source lazily at its position (skipping to its block: time, not memory).

Memory. The weight table (two floats per env config), the positions, and at most `max_open` open sources of
one block each (an LRU), plus up to 16 x max_open builder instances (~4 KB each) so that reopening an evicted
source skips rows rather than rebuilding: flat in rows, and in env configs up to the few bytes each above.
Verifiers load when an env's first task is drawn.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator

from hubgym.envs import OpenedEnv, open_env, resolve_env
from hubgym.errors import EnvContractError, Where
from hubgym.mixture.filters import MAX_REJECTIONS, TaskFilter
from hubgym.mixture.pool import BLOCK_ROWS, MAX_OPEN, Position, SourcePool
from hubgym.mixture.spec import EnvConfig, MixSpec, expand

__all__ = ["Drawn", "Mixture"]

FACTORIES_PER_OPEN = 16  # row factories (builder instances) kept per open source slot


@dataclass(frozen=True)
class Drawn:
    """One task of the stream and the env config it came from."""

    env: EnvConfig
    task: dict


class Mixture:
    """The stream; see the module docstring for the draw, its state and its memory."""

    def __init__(self, envs: list[EnvConfig], *, split: str, seed: int = 0, listing: Any = None,
                 task_filter: TaskFilter | None = None, max_open: int = MAX_OPEN, block: int = BLOCK_ROWS,
                 max_rejections: int = MAX_REJECTIONS, hub: str | None = None, trust: bool = False,
                 pins: dict[str, str] | None = None):
        if not envs:
            raise EnvContractError("the mixture selects no env config", Where(field="envs"), "list at least one env")
        self.envs, self.split, self.seed, self.task_filter = envs, split, seed, task_filter
        self.max_rejections = max_rejections
        self._listing, self._hub, self._trust, self._pins = listing, hub, trust, dict(pins or {})
        self._cumulative = list(itertools.accumulate(e.weight for e in envs))
        self._pool = SourcePool(self._opener, seed, max_open=max_open, block=block, block_of=self._block_of)
        self._block = block
        self._opened: dict[str, OpenedEnv] = {}
        self._factories: OrderedDict[str, Any] = OrderedDict()
        self.draws = 0
        self.positions: dict[str, Position] = {}

    @classmethod
    def from_spec(cls, spec: MixSpec, *, split: str, seed: int = 0, listing: Any = None, **options: Any) -> Mixture:
        """Expand a spec through the listing (default: the catalog) and make its stream."""
        if listing is None:
            from hubgym.envs.listing import listing as catalog

            listing = catalog()
        return cls(expand(spec, listing), split=split, seed=seed, listing=listing, **options)

    # -- the draw --------------------------------------------------------------------------------

    def choose(self, index: int) -> EnvConfig:
        """The env config of draw `index`: a pure function of (seed, index) and the weights."""
        point = random.Random(f"{self.seed}:{index}").random() * self._cumulative[-1]
        return self.envs[min(bisect.bisect_right(self._cumulative, point), len(self.envs) - 1)]

    def take(self, count: int) -> list[Drawn]:
        """The next `count` draws as tasks, no task twice. A draw whose env config has no task left that is not
        already in the batch is dropped (a batch may be shorter than `count` when an env is small)."""
        in_batch: dict[str, set[str]] = {}
        spent: set[str] = set()
        drawn = []
        for _ in range(count):
            env = self.choose(self.draws)
            self.draws += 1
            if env.key in spent:
                continue
            task = self._next_task(env, in_batch.setdefault(env.key, set()))
            if task is None:
                spent.add(env.key)
                continue
            in_batch[env.key].add(task["id"])
            drawn.append(Drawn(env, task))
        return drawn

    def __iter__(self) -> Iterator[Drawn]:
        """Draws one at a time, forever (tasks may repeat across draws once an env's epoch wraps)."""
        while True:
            yield from self.take(1)

    def _next_task(self, env: EnvConfig, in_batch: set[str]) -> dict | None:
        rejected = repeated = 0
        while True:
            row = self._next_row(env)
            if row["id"] in in_batch:
                repeated += 1
                if repeated > 2 * len(in_batch):  # an epoch and more of rows already in the batch: none is left
                    return None
                continue
            if self.task_filter is None or self.task_filter.keep(row["env"], row["id"]):
                return row
            rejected += 1
            if rejected >= self.max_rejections:
                raise EnvContractError(
                    f"the task filter {type(self.task_filter).__name__} rejected {rejected} tasks of env config "
                    f"{env.key!r} in a row, so no task of it can be drawn",
                    Where(env=env.name, config=env.config, split=self.split, row=row["id"], field="task_filter"),
                    "widen the filter (e.g. online.pass_band), or lower this env's weight to leave it out")

    def _next_row(self, env: EnvConfig) -> dict:
        at = self.positions.setdefault(env.key, Position())
        source = self._pool.source(env)
        row = source.row(at)
        if row is None:  # the epoch ran out: the next one, in another order
            at.epoch, at.pos = at.epoch + 1, 0
            row = source.row(at)
        at.pos += 1
        return row

    # -- state -----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything the stream's future depends on besides the seed, spec and filter (JSON)."""
        return {"draws": self.draws, "positions": {k: p.to_list() for k, p in sorted(self.positions.items())}}

    def restore(self, state: dict[str, Any]) -> Mixture:
        """Continue from a `state()`: the next draws are those the stream that saved it would have made."""
        self.draws = int(state["draws"])
        self.positions = {k: Position(*v) for k, v in state["positions"].items()}
        return self

    # -- opening env configs ---------------------------------------------------------------------

    def opened(self, env: EnvConfig) -> OpenedEnv:
        """An env config, opened (hubgym.envs.open_env: its verifier loaded now, once; no row generated)."""
        if env.key not in self._opened:
            spec = env.ref if env.source == "hub" else self._builder(env)
            self._opened[env.key] = open_env(spec, env.config, hub=self._hub, trust=self._trust, pins=self._pins)
        return self._opened[env.key]

    def weights_by_env(self) -> dict[str, float]:
        """Mixture weight per env name (the name rows carry), summed over its env configs: what the trainer
        weighs stored rows by. Listed envs need nothing opened; a hub env's name is read from its manifest."""
        weights: dict[str, float] = {}
        for env in self.envs:
            name = self.opened(env).env if env.source == "hub" else env.name
            weights[name] = weights.get(name, 0.0) + env.weight
        return weights

    def open_sources(self) -> int:
        """Sources open now (never above max_open)."""
        return self._pool.open_count()

    @property
    def pool(self) -> SourcePool:
        return self._pool

    def close(self) -> None:
        self._pool.close()

    def _builder(self, env: EnvConfig):
        if self._listing is not None:
            return self._listing.builder(env.ref)
        return resolve_env(env.ref)

    def _block_of(self, env: EnvConfig) -> int:
        """Rows shuffled together: none for a builder whose rows are random draws already (its class says so),
        so a slow procedural generator is not asked for a whole block to serve one row."""
        if env.source != "hub" and getattr(self._builder(env), "ROWS_IN_RANDOM_ORDER", False):
            return 1
        return self._block

    def _opener(self, env: EnvConfig):
        if env.source == "hub":
            return self.opened(env).rows(self.split)
        # A builder instance takes ~2 ms to make and ~4 KB to keep: kept for FACTORIES_PER_OPEN x max_open env
        # configs (an LRU of its own), so reopening an evicted source pays only its skip.
        factory = self._factories.pop(env.key, None)
        if factory is None:
            factory = self.opened(env).rows(self.split, seed=env.seed, size=env.size)
        self._factories[env.key] = factory
        while len(self._factories) > FACTORIES_PER_OPEN * self._pool.max_open:
            self._factories.popitem(last=False)
        return factory
