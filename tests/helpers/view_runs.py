"""Small real runs for the `hubgym view` tests: written by hubgym's rollout loop with the tiny model's tokenizer
against the instant server (valid wordle guesses and calculator calls at once, with token ids and logprobs), a
re-score of one of them with a changed verifier, and a copy whose messages carry hostile HTML."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

HOSTILE = '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2"><b>bold?</b>'
BONUS_VERIFIER = '''"""wordle's verifier, plus 0.25 for a reply that names a guess: a re-score changes rewards."""
from hubgym.verifiers.wordle import *  # noqa: F401,F403
from hubgym.verifiers.wordle import REWARDS as _REWARDS


def bonus(task, completion):
    return 0.25 if any("<guess>" in (m["content"] or "") for m in completion if m["role"] == "assistant") else 0.0


REWARDS = {**_REWARDS, bonus: 1.0}
REWARD_RANGE = (0.0, 1.25)
'''


@dataclass
class ViewRuns:
    wordle_a: Path  # wordle, seed 0, two rows a shard
    wordle_b: Path  # the same tasks, seed 1
    tools: Path  # calc_tools: calculator calls and their results
    rescored: Path  # wordle_a re-scored with BONUS_VERIFIER
    hostile: Path  # wordle_a's first shard with HOSTILE in its messages (nothing recorded its sha256)


def make_view_runs(tiny_model: Path, root: Path) -> ViewRuns:
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts
    from hubgym.rollout.instant_server import InstantServer
    from hubgym.score import rescore

    runs = ViewRuns(root / "wordle-a", root / "wordle-b", root / "tools", root / "wordle-a-rescored",
                    root / "hostile")
    with InstantServer(tiny_model, log_path=root / "instant.log") as server:
        for out, env, seed in ((runs.wordle_a, "wordle", 0), (runs.wordle_b, "wordle", 1),
                               (runs.tools, "calc_tools:calculator", 0)):
            config = RolloutConfig(envs=[env], model=str(tiny_model), out=str(out), engine="openai",
                                   base_url=server.url(env.split(":")[0]), n=2, limit=3, max_rows_per_shard=2,
                                   sampling=SamplingArgs(max_tokens=48, seed=seed), max_model_len=2048)
            run_rollouts(config, progress=False)
    verifier = root / "wordle_bonus.py"
    verifier.write_text(BONUS_VERIFIER)
    rescore(runs.wordle_a, verifier={"wordle": str(verifier)}, out=runs.rescored, workers=1)
    _hostile_copy(runs.wordle_a, runs.hostile)
    return runs


def _hostile_copy(run: Path, out: Path) -> None:
    first = sorted((run / "shards").glob("*.arrow"))[0]
    table = pa.ipc.open_file(str(first)).read_all()
    rows = table.to_pylist()
    rows[0]["completion"][0]["content"] = HOSTILE
    rows[0]["prompt"][-1]["content"] = HOSTILE
    (out / "shards").mkdir(parents=True)
    with pa.ipc.new_file(str(out / "shards" / first.name), table.schema) as writer:
        writer.write_table(pa.Table.from_pylist(rows, schema=table.schema))
