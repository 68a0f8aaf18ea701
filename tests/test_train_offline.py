"""The trainer on stored rollouts alone, in this process (no vLLM): stored rows are never judged stale, the
env metrics count every row read (not only the groups that train), the last step is checkpointed once, and a
run stopped after a checkpoint resumes with every step logged exactly once. And the online producer will not
train on a stored step that another run sampled."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from hubgym.train import checkpoint
from hubgym.train.config import TINY_CONFIG, load_config
from hubgym.train.trainer import Trainer

from helpers.scored_runs import make_run

pytestmark = pytest.mark.slow  # DeepSpeed

STEPS = 4


class Interrupted(Exception):
    """Stands in for a kill after the checkpoint of step 1 and the log line of step 2."""


@pytest.fixture()
def rollouts(tmp_path):
    # even groups: one right answer of two (trainable); odd groups: both wrong (zero variance, dropped)
    return make_run(tmp_path / "rollouts", "r", groups=16, right=lambda g, s: s == 0 and g % 2 == 0)


def run(model, rollouts, out):
    sets = [f"model={model}", f"output_dir={out}", f"offline.sources=[{rollouts}]", f"offline.steps={STEPS}",
            "eval.limit=0", "checkpoint_every=2", "batch.groups_per_step=2", "grpo.n=2", "log.every=1000",
            "loss.max_staleness=0"]  # stored rows are version 0: a step counter would call them stale from step 1
    trainer = Trainer(load_config(TINY_CONFIG, sets), console=Console(file=io.StringIO()))
    try:
        return trainer.run()
    finally:
        trainer.close()


def logged_steps(out) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "policy/loss" in r]


def test_stored_rows_train_every_step_and_env_metrics_count_every_row_read(tiny_model, rollouts, tmp_path,
                                                                           monkeypatch):
    saved: list[int] = []
    save = checkpoint.save_checkpoint

    def counted(policy, root, step, *args, **kwargs):
        saved.append(step)
        return save(policy, root, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_checkpoint", counted)
    result = run(tiny_model, rollouts, tmp_path / "out")
    steps = logged_steps(tmp_path / "out")
    assert [r["step"] for r in steps] == list(range(STEPS)) and result.steps == STEPS
    assert all(r["policy/tokens"] > 0 and r["train/groups"] == 2 for r in steps)
    # the trained groups score 0.5 on average; the all-wrong groups read beside them pull the rows' mean down
    rewards = [r["env/arithmetic/reward"] for r in steps]
    assert sum(rewards) / len(rewards) < 0.45, rewards
    assert saved == [1, 3]  # the last step is saved by the loop, not a second time after it


def test_a_stopped_run_resumes_with_each_step_logged_once(tiny_model, rollouts, tmp_path, monkeypatch):
    out = tmp_path / "out"
    train = Trainer._train

    def stop_at_step_3(self, step, *args):
        if step == 3:
            raise Interrupted
        return train(self, step, *args)

    monkeypatch.setattr(Trainer, "_train", stop_at_step_3)
    with pytest.raises(Interrupted):
        run(tiny_model, rollouts, out)
    assert [r["step"] for r in logged_steps(out)] == [0, 1, 2]  # step 2 came after the checkpoint of step 1
    monkeypatch.setattr(Trainer, "_train", train)
    result = run(tiny_model, rollouts, out)
    assert [r["step"] for r in logged_steps(out)] == list(range(STEPS)) and result.steps == STEPS


def test_the_online_producer_refuses_a_stored_step_of_another_run(tiny_model, tmp_path):
    from hubgym.engines import SamplingArgs
    from hubgym.train.config import ConfigError
    from hubgym.train.online import OnlineProducer

    out = tmp_path / "online"
    producer = OnlineProducer([("arithmetic:tiny", 1.0)], split="train", model=str(tiny_model), out_dir=out, n=2,
                              sampling=SamplingArgs(max_tokens=8), max_model_len=512)
    out.mkdir()
    (out / f"manifest-{producer.worker(0)}.json").write_text(json.dumps({"complete": True, "run_id": "0123456789ab"}))
    with pytest.raises(ConfigError, match=r"already holds online step 0 of another run \(run id 0123456789ab, this "
                                          r"config's is [0-9a-f]{12}.*train into a new output_dir"):
        producer.produce(None, None, step=0, version=0, groups=2)  # refused before any engine is used
