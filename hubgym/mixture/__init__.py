"""Mixtures: one seeded, resumable stream of tasks over any number of env configs, with flat memory.

    from hubgym.mixture import Mixture, load_mix_spec

    mix = Mixture.from_spec(load_mix_spec("mix.yaml"), split="train", seed=0)   # nothing opened yet
    for drawn in mix.take(64):                                              # one batch of tasks
        drawn.env.key, drawn.task["id"], mix.opened(drawn.env).verifier
    saved = mix.state()                                                     # resume: .restore(saved)

- `spec`: the spec format (names, families, tags, weights, overrides) and how weights combine.
- `listing`: the catalog it expands through (built-ins, entry points, env families).
- `sources`: lazy per-env row sources and the LRU pool that bounds them.
- `stream`: the draw, its state and its memory.
- `filters`: the TaskFilter hook (difficulty bands).
"""

from hubgym.mixture.filters import MAX_REJECTIONS, KeepAll, TaskFilter
from hubgym.mixture.spec import EnvConfig, MixEntry, MixSpec, expand, load_mix_spec, parse_spec, spec_digest
from hubgym.mixture.stream import Drawn, Mixture

__all__ = ["Drawn", "EnvConfig", "KeepAll", "MAX_REJECTIONS", "MixEntry", "MixSpec", "Mixture",
           "TaskFilter", "expand", "load_mix_spec", "parse_spec", "spec_digest"]
