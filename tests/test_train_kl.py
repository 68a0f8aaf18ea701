"""loss.beta > 0 on the real trainer: the reference is the initial weights, frozen, under ZeRO-2 and ZeRO-3;
`policy/kl` is 0 at the first step (the policy is the reference) and rises as the policy moves away."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from hubgym.train.config import TINY_CONFIG, load_config
from hubgym.train.trainer import Trainer

from helpers.interrupts import Interrupted
from helpers.scored_runs import contrasting_run

STEPS = 4
pytestmark = pytest.mark.slow


def kl_run(settings: list[str]) -> tuple[list[dict], Trainer]:
    """Train with `settings`; the logged steps that trained, and the trainer (closed)."""
    trainer = Trainer(load_config(TINY_CONFIG, settings), console=Console(file=io.StringIO()))
    try:
        result = trainer.run()
    finally:
        trainer.close()
    lines = map(json.loads, result.metrics_file.read_text().splitlines())
    return [r for r in lines if "policy/loss" in r], trainer


def assert_kl_starts_at_zero_and_rises(steps: list[dict]) -> None:
    kl = [r["policy/kl"] for r in steps]
    assert len(kl) >= 3 and all(r["policy/skipped"] == 0.0 for r in steps), steps
    assert kl[0] == pytest.approx(0.0, abs=1e-6), kl  # the policy is the reference before its first update
    assert 0.0 < kl[1] < kl[-1], kl


@pytest.mark.parametrize("zero", [2, 3])
def test_a_kl_run_on_stored_rollouts_trains_from_a_frozen_reference(tiny_model, tmp_path, zero):
    rollouts = contrasting_run(tmp_path / "rollouts")
    steps, trainer = kl_run([f"model={tiny_model}", f"output_dir={tmp_path / 'out'}", f"offline.sources=[{rollouts}]",
                             f"offline.steps={STEPS}", "eval.limit=0", "batch.groups_per_step=4", "grpo.n=2",
                             "loss.beta=0.1", "optim.lr=2e-3", f"optim.zero_stage={zero}", "log.every=1000"])
    assert [r["step"] for r in steps] == list(range(STEPS))
    assert_kl_starts_at_zero_and_rises(steps)
    reference = trainer.reference.model
    assert not any(p.requires_grad for p in reference.parameters())  # frozen: no gradient
    assert not isinstance(getattr(reference, "optimizer", None), torch.optim.Optimizer)  # and no optimizer state
    assert all(hasattr(p, "ds_id") for p in reference.parameters()) == (zero == 3)  # partitioned under ZeRO-3


def test_a_resumed_kl_run_keeps_the_initial_weights_as_its_reference(tiny_model, tmp_path, monkeypatch):
    rollouts = contrasting_run(tmp_path / "rollouts")

    def settings(out: Path) -> list[str]:
        return [f"model={tiny_model}", f"output_dir={out}", f"offline.sources=[{rollouts}]", f"offline.steps={STEPS}",
                "eval.limit=0", "batch.groups_per_step=4", "grpo.n=2", "loss.beta=0.1", "checkpoint_every=2",
                "log.every=1000"]

    straight, _ = kl_run(settings(tmp_path / "straight"))
    train = Trainer._train

    def stop_at_step_2(self, step, *args):
        if step == 2:
            raise Interrupted
        return train(self, step, *args)

    monkeypatch.setattr(Trainer, "_train", stop_at_step_2)
    with pytest.raises(Interrupted):
        kl_run(settings(tmp_path / "resumed"))
    monkeypatch.setattr(Trainer, "_train", train)
    resumed, _ = kl_run(settings(tmp_path / "resumed"))  # a reference loaded from the checkpoint would give kl 0
    assert [r["step"] for r in resumed] == list(range(STEPS))
    kl = [r["policy/kl"] for r in resumed]
    assert kl == pytest.approx([r["policy/kl"] for r in straight], rel=1e-5) and kl[2] > 0.0, kl


def test_a_kl_run_on_fresh_rollouts_starts_at_zero(tiny_model, tmp_path):
    """The online path: vLLM samples the policy, the reference scores the same packed micro-batches."""
    steps, _ = kl_run([f"model={tiny_model}", f"output_dir={tmp_path}", "envs=[{name: reverse_text}]",
                       "online.steps=3", "grpo.n=4", "batch.groups_per_step=4", "sampling.max_tokens=12",
                       "eval.limit=0", "loss.beta=0.1", "online.max_model_len=512", "log.every=1000"])
    kl = [r["policy/kl"] for r in steps]
    assert [r["step"] for r in steps] == [0, 1, 2] and all(r["train/phase"] == 1 for r in steps)
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and min(kl[1:]) > 0.0, kl
