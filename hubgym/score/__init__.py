"""score: re-score and replay stored rollouts.

    result = rescore("runs/r1", verifier="my_envs/arith_v2.py", out="runs/r1-v2")
    result.diff                                  # per env and component: rows whose reward changed
    result.changes                               # exactly which rows and components changed

No model or tool runs: a stored trajectory holds everything its verifier needs. To spread shards
over machines yourself (a Ray task per shard, say), map `rescore_shard` (or `rescore_shards`, for a
bundle of small shards) over them and combine the results with `merge_parts` (see shards.py).
"""

from hubgym.score.diff import plot_diff
from hubgym.score.rescore import RescoreResult, rescore
from hubgym.score.shards import ShardResult, merge_parts, rescore_shard, rescore_shards

__all__ = ["RescoreResult", "ShardResult", "merge_parts", "plot_diff", "rescore", "rescore_shard", "rescore_shards"]
