"""The `gymnasium` family: Gymnasium's toy-text worlds as multi_turn envs (`gym_*`).

    from hubgym.bridges.gymnasium import FAMILY
    FAMILY.entries()                                # the catalog rows, read from gymnasium.json (no gymnasium import)
    Lake = FAMILY.builder("gym_frozen_lake")        # configs 4x4, 8x8, random_4x4, random_6x6, random_8x8
    hubgym.build_tasks(Lake, "random_6x6")["test"]

Each env is one world of `gymnasium.envs.toy_text` (hubgym.bridges.gymnasium_worlds): Frozen Lake on its two
fixed maps (slippery, as Gymnasium makes them) and on random maps drawn from the row's seed, Taxi (plain and
rainy), Cliff Walking (slippery, and the one still world) and Blackjack. A row holds the world, its options, a
seed and the limits; the verifier (hubgym.bridges.gymnasium_verifier) rebuilds the world from the seed and the
stored actions at every step, so `step` is pure.

Tasks: where the world is stochastic (slippery ice, rain, cards) the seed is the task; where it is not (a random
map, Taxi's start) the opening is, so two seeds that open alike are one task, and a split never holds it twice
and the held-out split never holds one of train's.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Iterator

from hubgym.bridges.gymnasium_worlds import WORLDS
from hubgym.builders.base import TaskBuilder, TaskConfig
from hubgym.builders.families import FamilyEnv, load_index, unknown_env
from hubgym.builders.families import write_index as write_family_index
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import Task, interaction, make_task, system

HERE = Path(__file__).resolve().parent
INDEX = HERE / "gymnasium.json"
HELD_OUT = 5  # one task in HELD_OUT (by a hash of its key) is kept out of the train split
SYSTEM = ("You are playing {title} (Gymnasium's toy-text world). {rules} Each turn shows the world and your moves; "
          "reply with one move inside <move></move>, e.g. <move>{example}</move>. A reply without a move is counted; "
          "the {max_invalid} ends the episode. The episode stops after {move_limit} moves.")


@dataclass
class GymConfig(TaskConfig):
    options: dict[str, Any] = field(default_factory=dict)  # the world's options (gymnasium_verifier.OPTIONS)
    move_limit: int = 30  # moves before the episode stops
    max_invalid: int = 3  # the max_invalid-th reply without a move ends the episode
    by_opening: bool = False  # the world is deterministic after reset: the opening, not the seed, is the task


@dataclass(frozen=True)
class Env:
    """One env of the family: its world, tags and configs (the first is the default)."""

    world: str
    tags: tuple[str, ...]
    description: str
    configs: tuple[GymConfig, ...]


def _lake(name: str, size: int, random_map: bool) -> GymConfig:
    options = {"random_size": size, "is_slippery": False} if random_map else {"map_name": name, "is_slippery": True}
    return GymConfig(name=name if not random_map else f"random_{size}x{size}", options=options,
                     move_limit=4 * size if random_map else 8 * size - 2, by_opening=random_map,
                     sizes={"train": 200, "test": 50})


ENVS: dict[str, Env] = {
    "gym_frozen_lake": Env("frozen_lake", ("games", "gymnasium", "grid", "navigation"),
                           "cross a frozen lake to the goal without falling into a hole (Gymnasium FrozenLake)",
                           (_lake("4x4", 4, False), _lake("8x8", 8, False), _lake("", 4, True), _lake("", 6, True),
                            _lake("", 8, True))),
    "gym_taxi": Env("taxi", ("games", "gymnasium", "grid", "planning"),
                    "pick up a passenger and drop them at their stop (Gymnasium Taxi)",
                    (GymConfig(name="default", move_limit=40, by_opening=True, sizes={"train": 200, "test": 40}),
                     GymConfig(name="rainy", options={"is_rainy": True}, move_limit=60,
                               sizes={"train": 200, "test": 50}))),
    "gym_cliff_walking": Env("cliff_walking", ("games", "gymnasium", "grid", "navigation"),
                             "walk along a cliff to the target without falling off (Gymnasium CliffWalking)",
                             (GymConfig(name="slippery", options={"is_slippery": True}, move_limit=40,
                                        sizes={"train": 200, "test": 50}),
                              GymConfig(name="still", move_limit=30, by_opening=True, sizes={"test": 1}))),
    "gym_blackjack": Env("blackjack", ("games", "gymnasium", "cards", "chance"),
                         "beat the dealer at blackjack, hit or stick (Gymnasium Blackjack)",
                         (GymConfig(name="default", move_limit=12, sizes={"train": 200, "test": 50}),)),
}
"""Every env of the family. Taxi has 300 openings; Cliff Walking's still world has one."""


def index_entries() -> list[FamilyEnv]:
    """The family's catalog rows (no gymnasium import)."""
    return [FamilyEnv(name, "multi_turn", tuple(c.name for c in env.configs), env.tags, "gymnasium", env.description)
            for name, env in sorted(ENVS.items())]


def write_index(path: str | Path = INDEX) -> None:
    """Regenerate the shipped index (`python -c "from hubgym.bridges.gymnasium import write_index; write_index()"`)."""
    write_family_index(path, index_entries())


def held_out(key: str) -> bool:
    """Whether a task (by its key) belongs to the held-out splits: a hash decides, so train never shares one."""
    return int(hashlib.sha256(f"gymnasium:{key}".encode()).hexdigest(), 16) % HELD_OUT == 0


class GymWorld(TaskBuilder):
    """Base of the family's builders; `FAMILY.builder(name)` makes one subclass per env."""

    KIND = "multi_turn"
    VERIFIER = "hubgym.bridges.gymnasium_verifier"
    BUILDER_CONFIG_CLASS = GymConfig
    ROWS_IN_RANDOM_ORDER = True
    WORLD: str

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        """Distinct tasks of this split (by seed, or by opening), each a row."""
        from hubgym.bridges.gymnasium_verifier import reset

        cfg, rng, world = self.config, random.Random(seed), WORLDS[self.WORLD]
        self._check(split, size)
        spec = interaction("multi_turn", max_turns=cfg.move_limit + cfg.max_invalid - 1)
        example = world.actions[0]
        prompt = [system(SYSTEM.format(title=world.title, rules=world.rules, example=example,
                                       max_invalid=_ordinal(cfg.max_invalid), move_limit=cfg.move_limit))]
        seen: set[str] = set()
        for _ in range(200 * size + 200):  # bounded: a world with fewer openings than `size` ends the split
            if len(seen) == size:
                return
            info = {"world": self.WORLD, "options": cfg.options, "seed": rng.randrange(2**31),
                    "max_invalid": cfg.max_invalid, "move_limit": cfg.move_limit}
            key = reset({"info": info})[1] if cfg.by_opening else str(info["seed"])
            if key in seen or (held_out(key) != (split != "train") and len(cfg.sizes) > 1):
                continue
            seen.add(key)
            yield make_task(self.ENV, prompt, info, spec, difficulty=cfg.name, tags=self.TAGS)

    def _check(self, split: str, size: int) -> None:
        """Limits are validated here, once, before any row is drawn."""
        where, cfg = Where(self.ENV, self.config.name, split), self.config
        for name, value, low, high in (("move_limit", cfg.move_limit, 1, 200), ("max_invalid", cfg.max_invalid, 1, 10)):
            if not low <= value <= high:
                raise EnvContractError(f"{name} is {value}", replace(where, field=name), f"use {name} in {low}..{high}")
        if size < 0:
            raise EnvContractError(f"size is {size}", replace(where, field="sizes"), "use sizes >= 0")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


_DOC = """{name}: {description}.

Task:
    {rules} One move per reply inside <move></move>: {actions}.
Row schema:
    info = {{"world": "{world}", "options": {{...}}, "seed": int, "max_invalid": int, "move_limit": int}};
    interaction multi_turn, max_turns = move_limit + max_invalid - 1. No task of the "train" split (a seed, or an
    opening where the world is deterministic) appears in another split.
Reward:
    Final step: the world's outcome (1.0 for the goal; Blackjack: win 1.0, draw 0.5, loss 0.0); 0.0 at the move
    limit or on a forfeit; other steps 0.0. Metrics (weight 0): gym_return, invalid_moves.
Arguments:
    configs {configs}; GymConfig.options, .move_limit, .max_invalid, TaskConfig.seed and .sizes.
Version history:
    v1: first release (gymnasium 1.4).
"""


class _GymnasiumFamily:
    """The family object the registry and the catalog use (see hubgym.builders.families.EnvFamily)."""

    name = "gymnasium"
    prefix = "gym_"

    def entries(self) -> list[FamilyEnv]:
        return load_index(INDEX, source=self.name)

    def builder(self, name: str) -> type[TaskBuilder]:
        if name not in ENVS:
            raise unknown_env(name, self.name, sorted(ENVS))
        return _builder(name)


@cache
def _builder(name: str) -> type[TaskBuilder]:
    """One TaskBuilder subclass per env, made once (so `datasets` fingerprints stay stable)."""
    env = ENVS[name]
    world = WORLDS[env.world]
    doc = _DOC.format(name=name, description=env.description, rules=world.rules, world=env.world,
                      actions=", ".join(world.actions), configs=", ".join(c.name for c in env.configs))
    attrs = {"__doc__": doc, "__module__": __name__, "ENV": name, "WORLD": env.world, "TAGS": env.tags,
             "GOLDEN": str(HERE / "golden" / f"{name}.jsonl"), "BUILDER_CONFIGS": list(env.configs)}
    return type("".join(part.title() for part in name.split("_")), (GymWorld,), attrs)


FAMILY = _GymnasiumFamily()
