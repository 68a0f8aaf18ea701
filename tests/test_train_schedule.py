"""Training knobs on the real trainer: the lr schedule (warmup, decay, resumed exactly from a checkpoint), bf16 with
fp32 master weights on this CPU, and gradient checkpointing on the real SmolLM2 model (the same step as without)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console

from hubgym.train.config import TINY_CONFIG, load_config
from hubgym.train.schedule import Schedule, lr_factor
from hubgym.train.trainer import Trainer

from helpers.interrupts import Interrupted
from helpers.scored_runs import contrasting_run

STEPS, LR = 6, 1e-2


def test_the_schedule_warms_up_then_decays_to_its_floor():
    cosine = Schedule("cosine", warmup_steps=2, total_steps=10, min_lr_ratio=0.1)
    assert [lr_factor(s, cosine) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]  # never 0 at the first update
    assert lr_factor(6, cosine) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(10, cosine) == pytest.approx(0.1) and lr_factor(50, cosine) == pytest.approx(0.1)
    linear = Schedule("linear", total_steps=4)
    assert [lr_factor(s, linear) for s in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert {lr_factor(s, Schedule()) for s in range(5)} == {1.0}


def run(settings: list[str]) -> list[dict]:
    trainer = Trainer(load_config(TINY_CONFIG, settings), console=Console(file=io.StringIO()))
    try:
        result = trainer.run()
    finally:
        trainer.close()
    return [r for r in map(json.loads, result.metrics_file.read_text().splitlines()) if "policy/loss" in r]


@pytest.mark.slow
def test_a_resumed_run_continues_the_lr_schedule_exactly(tiny_model, tmp_path, monkeypatch):
    rollouts = contrasting_run(tmp_path / "rollouts")

    def settings(out: Path) -> list[str]:
        return [f"model={tiny_model}", f"output_dir={out}", f"offline.sources=[{rollouts}]", f"offline.steps={STEPS}",
                "eval.limit=0", "batch.groups_per_step=4", "grpo.n=2", f"optim.lr={LR}", "optim.schedule=cosine",
                "optim.warmup_steps=2", "optim.min_lr_ratio=0.1", "checkpoint_every=2", "log.every=1000"]

    straight = [r["optim/lr"] for r in run(settings(tmp_path / "straight"))]
    schedule = Schedule("cosine", warmup_steps=2, total_steps=STEPS, min_lr_ratio=0.1)
    assert straight == pytest.approx([LR * lr_factor(s, schedule) for s in range(STEPS)], rel=1e-9)
    train = Trainer._train

    def stop_at_step_3(self, step, *args):
        if step == 3:
            raise Interrupted
        return train(self, step, *args)

    monkeypatch.setattr(Trainer, "_train", stop_at_step_3)
    with pytest.raises(Interrupted):
        run(settings(tmp_path / "resumed"))
    monkeypatch.setattr(Trainer, "_train", train)
    resumed = run(settings(tmp_path / "resumed"))  # from the checkpoint after step 1
    assert [r["step"] for r in resumed] == list(range(STEPS))
    assert [r["optim/lr"] for r in resumed] == pytest.approx(straight, rel=1e-12)


@pytest.mark.slow
def test_bf16_trains_on_this_cpu(tiny_model, tmp_path):
    rollouts = contrasting_run(tmp_path / "rollouts")
    steps = run([f"model={tiny_model}", f"output_dir={tmp_path / 'out'}", f"offline.sources=[{rollouts}]",
                 "offline.steps=3", "eval.limit=0", "batch.groups_per_step=4", "grpo.n=2", f"optim.lr={LR}",
                 "optim.bf16=true", "log.every=1000"])
    assert [r["policy/skipped"] for r in steps] == [0.0, 0.0, 0.0]
    assert all(math.isfinite(r["policy/loss"]) and r["policy/grad_norm"] > 0 for r in steps)
    assert steps[0]["policy/loss"] != steps[-1]["policy/loss"]  # the weights moved


@pytest.mark.slow
def test_gradient_checkpointing_takes_the_same_step_on_smollm2(smollm2_model):
    from helpers.ds_steps import nll_loss

    from hubgym.train.batch import MicroBatch
    from hubgym.train.engine import DeepSpeedSettings, Policy

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (2, 24), generator=gen)
    ones = torch.ones_like(ids)
    batch = MicroBatch(input_ids=ids, attention_mask=ones, loss_mask=ones.float(), old_logprobs=ones.float() * 0,
                       advantages=torch.zeros(2), weights=torch.ones(2), num_sequences=2, num_tokens=46)
    results = []
    for checkpointing in (False, True):
        policy = Policy(smollm2_model, DeepSpeedSettings(lr=1e-4, gradient_checkpointing=checkpointing))
        first = policy.train_step([batch], nll_loss)
        second = policy.train_step([batch], nll_loss)  # its loss shows the update the first step made
        results.append((first.loss, first.grad_norm, second.loss))
        del policy
    (loss, norm, after), (loss_gc, norm_gc, after_gc) = results
    assert loss_gc == pytest.approx(loss, rel=1e-5) and norm_gc == pytest.approx(norm, rel=1e-4)
    assert after_gc == pytest.approx(after, rel=1e-5) and after < loss
