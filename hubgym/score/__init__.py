"""score: re-score and replay stored rollouts.

    result = rescore("runs/r1", verifier="my_envs/arith_v2.py", out="runs/r1-v2")
    result.diff                                  # per env and component: rows whose reward changed
    result.changes                               # exactly which rows and components changed

No model or tool runs: a stored trajectory holds everything its verifier needs.
"""

from hubgym.score.diff import plot_diff
from hubgym.score.rescore import RescoreResult, rescore

__all__ = ["RescoreResult", "plot_diff", "rescore"]
