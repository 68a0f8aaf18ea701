"""The rollout progress bar counts this worker's groups, the rollouts of resumed runs and failed rollouts."""

from __future__ import annotations

import pytest

import io
import os
import re
import subprocess
import sys
import textwrap

from rich.console import Console

from hubgym.hub.rollouts import iter_rollouts
from hubgym.rollout.progress import RolloutProgress

pytestmark = pytest.mark.slow  # runs the real engine in a child


def final_line(text: str) -> str:
    """The bar as last rendered, without the elapsed time and the token rate (which depend on the clock)."""
    line = [raw for raw in text.splitlines() if raw.startswith("groups")][-1]
    return re.sub(r" · [\d,]+ tok/s.*$", "", re.sub(r"\s*━+\s*", " ", line)).strip()


def group(n: int, failed: int = 0) -> list[dict]:
    return [{"reward": None if i < failed else 1.0} for i in range(n)]


def test_bar_counts_groups_rollouts_resumed_and_failed():
    out = io.StringIO()
    with RolloutProgress(5, 4, stored=3, console=Console(file=out, width=200)) as bar:
        bar.advance(group(4, failed=1), tokens=10)
        bar.advance(group(4), tokens=20)
    assert final_line(out.getvalue()) == "groups 5/5 rollouts 20/20 · 12 resumed · 1 failed · 30 tok"

    out = io.StringIO()
    with RolloutProgress(3, 2, console=Console(file=out, width=200)) as bar:
        bar.advance(group(2, failed=2), tokens=0)
    assert final_line(out.getvalue()) == "groups 1/3 rollouts 2/6 · 2 failed · 0 tok"


SCRIPT = textwrap.dedent("""
    import sys
    from hubgym.errors import EngineError, RequestError
    from hubgym.engines import SamplingArgs, VLLMEngine
    from hubgym.rollout import RolloutConfig, run_rollouts

    class Scripted(VLLMEngine):
        '''The real engine; the i-th request (one per group: single_turn, concurrency 1) fails as `faults` says.'''
        faults, calls = {}, 0

        async def generate(self, request, sampling):
            self.calls += 1
            if self.calls in self.faults:
                raise self.faults[self.calls]
            return await super().generate(request, sampling)

    if __name__ == "__main__":
        model, out = sys.argv[1], sys.argv[2]
        config = RolloutConfig(envs=["arithmetic:easy"], model=model, out=out, n=2, limit=12, num_shards=2,
                               shard_index=0, concurrency=1, sampling=SamplingArgs(max_tokens=8), max_model_len=256)
        engine = Scripted(model, max_model_len=256)
        engine.faults = {1: RequestError("refused"), 4: EngineError("engine died")}  # group 1 fails, then the run
        try:
            run_rollouts(config, engine=engine)
        except EngineError:
            print("== stopped", flush=True)
        engine.faults = {}
        summary = run_rollouts(config, engine=engine)  # resumes: the 3 stored groups count as done
        print(f"== done {summary.written} {summary.skipped}", flush=True)
        engine.close()
""")


def test_progress_of_a_failed_then_resumed_worker(tiny_model, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "COLUMNS": "250"}
    result = subprocess.run([sys.executable, str(script), str(tiny_model), str(tmp_path / "run")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    mine = len({row["task_id"] for row in iter_rollouts([tmp_path / "run"])})  # worker 0's share of the 12 tasks
    assert 4 <= mine < 12

    first, second = result.stdout.split("== stopped")
    assert final_line(first).startswith(f"groups 3/{mine} rollouts 6/{2 * mine} · 2 failed · ")
    rollouts = 2 * mine
    assert final_line(second).startswith(f"groups {mine}/{mine} rollouts {rollouts}/{rollouts} · 6 resumed · 0 failed")
    assert f"== done {2 * (mine - 3)} 6" in second
