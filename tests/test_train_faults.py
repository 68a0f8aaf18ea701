"""The online phase survives losing its vLLM engine, and evaluates the policy periodically.

One short online run: after the first step the vLLM engine-core process is killed (SIGKILL, as an
out-of-memory kill would); the next step finds it dead before syncing the new weights, starts a fresh
engine with them, and the run completes every step, with no step's rollouts missing or doubled.
"""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from helpers.engines import ENGINE_PROCESSES
from hubgym.hub.rollouts import iter_rollouts
from hubgym.train.config import TINY_CONFIG, load_config
from hubgym.train.trainer import Trainer

pytestmark = pytest.mark.slow
STEPS = 4


def kill_engine_core() -> int:
    cores = [p for p in psutil.Process().children(recursive=True) if p.name() == "VLLM::EngineCore"]
    assert len(cores) == 1, f"expected one vLLM engine core, found {cores}"
    os.kill(cores[0].pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until it is gone; not reaped here (vLLM does that, as after a real crash)
        try:
            if cores[0].status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.01)
    return cores[0].pid


def test_a_lost_engine_is_restarted_and_periodic_eval_runs(tiny_model, tmp_path, monkeypatch):
    cfg = load_config(TINY_CONFIG, [f"model={tiny_model}", f"output_dir={tmp_path}", f"online.steps={STEPS}",
                             "online.sync_every=1", "eval.limit=4", "eval.n=1", "eval.every=2", "log.every=1000",
                             "batch.groups_per_step=2", "grpo.n=4"])
    killed: list[int] = []
    train = Trainer._train
    for name, value in ENGINE_PROCESSES.items():  # the engine core a kill can take away, in its own process
        monkeypatch.setenv(name, value)

    def train_then_kill(self, step, groups, rows, started):
        metrics = train(self, step, groups, rows, started)
        if step == 0:
            killed.append(kill_engine_core())
        return metrics

    monkeypatch.setattr(Trainer, "_train", train_then_kill)
    trainer = Trainer(cfg)
    try:
        result = trainer.run()
    finally:
        trainer.close()

    assert killed and result.counts["engine_restarts"] == 1
    assert trainer.weights and result.steps == STEPS
    lines = [json.loads(line) for line in result.metrics_file.read_text().splitlines()]
    trained = [line["step"] for line in lines if "train/groups" in line]
    assert trained == list(range(STEPS))  # every step ran, the one after the kill included
    evaluated = sorted({line["step"] for line in lines if any(k.startswith("eval/") for k in line)})
    assert evaluated == [0, 2, STEPS]  # before, every 2 steps, after

    rows = list(iter_rollouts([tmp_path / "online"]))
    ids = [row["rollout_id"] for row in rows]
    assert len(ids) == len(set(ids)) == STEPS * 2 * 4  # each step's groups, once
    versions = {row["run_id"]: row["provenance"]["policy_version"] for row in rows}
    assert sorted(versions.values()) == list(range(STEPS))  # the restarted engine serves the synced weights
