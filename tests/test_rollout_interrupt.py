"""Ctrl-C in a rollout run when vLLM's processes die of it first, and the helper that tells an interrupt from an
engine failure. (Ctrl-C of the `hubgym rollout` command itself: tests/test_rollout_kill.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.engines import ENGINE_PROCESSES
from hubgym.hub.rollouts import iter_rollouts

pytestmark = pytest.mark.slow


# The worst order of a terminal's Ctrl-C: vLLM's processes die of it first, and the signal reaches hubgym's main
# thread only after requests have failed with EngineError. The engine is the real one; its children get the SIGINT.
ENGINE_DIES_FIRST = r'''
import os, signal, sys
import psutil
from hubgym.errors import EngineError
from hubgym.engines import SamplingArgs, VLLMEngine
from hubgym.rollout import RolloutConfig, run_rollouts

class DiesOfCtrlCFirst(VLLMEngine):
    finished, signalled = 0, False

    async def generate(self, request, sampling):
        try:
            samples = await super().generate(request, sampling)
        except EngineError:
            if not self.signalled:
                self.signalled = True
                os.kill(os.getpid(), signal.SIGINT)
            raise
        self.finished += 1
        if self.finished == 10:  # two shards of 16 rows are stored by now
            for child in psutil.Process().children(recursive=True):
                child.send_signal(signal.SIGINT)
        return samples

model, out, kill = sys.argv[1], sys.argv[2], sys.argv[3] == "kill"
config = RolloutConfig(envs=["arithmetic:medium"], model=model, out=out, n=4, limit=60, concurrency=8 if kill else 32,
                       max_rows_per_shard=16, sampling=SamplingArgs(max_tokens=32))
engine = (DiesOfCtrlCFirst if kill else VLLMEngine)(model, max_model_len=512)
try:
    summary = run_rollouts(config, engine=engine, progress=False)
except KeyboardInterrupt:
    print("interrupted")
    sys.exit(130)
print(f"done {summary.written} {summary.skipped}")
'''


def test_ctrl_c_that_kills_vllm_before_hubgym_sees_it_still_reads_as_an_interrupt(tiny_model, tmp_path):
    out = tmp_path / "run"
    run = [sys.executable, "-c", ENGINE_DIES_FIRST, str(tiny_model), str(out)]

    killed = subprocess.run([*run, "kill"], capture_output=True, text=True, timeout=600,
                            env={**os.environ, **ENGINE_PROCESSES})  # engine processes for the SIGINT to kill
    assert killed.returncode == 130, killed.stdout[-2000:] + killed.stderr[-3000:]  # not an engine failure (1)
    assert "interrupted" in killed.stdout
    stored = len(list(iter_rollouts([out])))
    assert 40 <= stored < 240

    resumed = subprocess.run([*run, "resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"done {240 - stored} {stored}" in resumed.stdout
    ids = [row["rollout_id"] for row in iter_rollouts([out])]
    assert len(ids) == 240 and len(set(ids)) == 240


UNTIL_CTRL_C = r'''
import asyncio, os, signal
from hubgym.errors import EngineError
from hubgym.rollout.interrupt import until_done_or_ctrl_c

def own_handler(*_):
    pass

signal.signal(signal.SIGINT, own_handler)

async def finishes():
    await asyncio.sleep(0.01)

async def ctrl_c_then_waits():
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.sleep(30)

async def ctrl_c_then_engine_dies():
    os.kill(os.getpid(), signal.SIGINT)
    raise EngineError("vLLM generate failed: EngineDeadError")

async def engine_dies():
    raise EngineError("vLLM generate failed: EngineDeadError")

print("finished", asyncio.run(until_done_or_ctrl_c(finishes())))
print("ctrl-c", asyncio.run(until_done_or_ctrl_c(ctrl_c_then_waits())))
print("ctrl-c, engine error", asyncio.run(until_done_or_ctrl_c(ctrl_c_then_engine_dies())))
try:
    asyncio.run(until_done_or_ctrl_c(engine_dies()))
except EngineError:
    print("engine error raised")
print("own handler back", signal.getsignal(signal.SIGINT) is own_handler)
'''


def test_until_done_or_ctrl_c_tells_an_interrupt_from_an_engine_failure_and_restores_the_handler():
    done = subprocess.run([sys.executable, "-c", UNTIL_CTRL_C], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["finished False", "ctrl-c True", "ctrl-c, engine error True",
                                        "engine error raised", "own handler back True"]
