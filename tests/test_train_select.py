"""The offline phase on a selection of stored rows, re-scored as it reads them, as GRPO or as SFT, on the real
DeepSpeed in this process (no vLLM). What a run learned is read off its exported weights: the stored groups'
right sample (sample 0) and wrong sample (sample 1) answer with token ids of their own (contrasting_run), so the
policy's logprob of each sample's tokens says which way training pushed it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from hubgym.errors import BadRowError, SelectionError
from hubgym.hub.rollouts import iter_rollouts
from hubgym.rollout.writer import ShardWriter
from hubgym.train.config import TINY_CONFIG, load_config
from hubgym.train.trainer import Trainer
from hubgym.verifiers import arithmetic as arithmetic_verifier

from helpers.scored_runs import contrasting_run

pytestmark = pytest.mark.slow  # DeepSpeed
STEPS = 3


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    return contrasting_run(tmp_path_factory.mktemp("stored"))


@pytest.fixture(scope="module")
def stored_rows(stored) -> list[dict]:
    return list(iter_rollouts([stored]))


def train(model: Path, sources: Path, out: Path, *settings: str) -> tuple[list[dict], str]:
    """Offline steps on `sources`; the logged steps and what the console printed."""
    console = Console(file=io.StringIO(), width=200)
    cfg = load_config(TINY_CONFIG, [f"model={model}", f"output_dir={out}", f"offline.sources=[{sources}]",
                                    f"offline.steps={STEPS}", "eval.limit=0", "batch.groups_per_step=8", "grpo.n=2",
                                    "optim.lr=1e-2", "log.every=1000", *settings])
    trainer = Trainer(cfg, console=console)
    try:
        result = trainer.run()
    finally:
        trainer.close()
    lines = map(json.loads, result.metrics_file.read_text().splitlines())
    return [r for r in lines if "policy/loss" in r], console.file.getvalue()


def sample_logprob(model_dir: Path, rows: list[dict], sample: int) -> float:
    """Mean logprob per token of sample `sample`'s completion tokens, under the model in `model_dir`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in (r for r in rows if r["sample"] == sample):
            ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
            total += float(logp[-len(row["completion_ids"]):].sum())
            count += len(row["completion_ids"])
    return total / count


def inverted_verifier(folder: Path) -> Path:
    """arithmetic's verifier, rewarding a wrong answer instead of the right one (what a fixed bug might do)."""
    source = Path(arithmetic_verifier.__file__).read_text()
    old = "    return [_equals(_answer(task, completion), task[\"info\"][\"answer\"])"
    assert old in source
    path = folder / "inverted.py"
    path.write_text(source.replace(old, old.replace("return [_equals", "return [1.0 - _equals")))
    return path


def test_rescoring_while_streaming_trains_on_the_new_rewards(tiny_model, stored, stored_rows, tmp_path):
    """As stored, sample 0 is right (advantage +1) and sample 1 wrong: trained on the stored rewards, GRPO would raise
    sample 0's tokens. Re-scored by a verifier that rewards the other answer, the same rows push the other way."""
    before = [sample_logprob(tiny_model, stored_rows, s) for s in (0, 1)]
    rescored, printed = train(tiny_model, stored, tmp_path / "rescored", "offline.rescore=true",
                              f"offline.verifier=[{inverted_verifier(tmp_path)}]")
    after = [sample_logprob(tmp_path / "rescored" / "model", stored_rows, s) for s in (0, 1)]
    assert after[0] < before[0] and after[1] > before[1]  # sample 1 is now the rewarded one
    assert all(r["offline/rescore/changed_rows"] == len(stored_rows) for r in rescored)
    assert "re-scored, reward changed" in printed
    assert not list(stored.rglob("*rescore*"))  # the stored shards are left as they were


def test_sft_on_a_reward_selection_learns_only_the_kept_replies(tiny_model, stored, stored_rows, tmp_path):
    before = [sample_logprob(tiny_model, stored_rows, s) for s in (0, 1)]
    steps, printed = train(tiny_model, stored, tmp_path / "sft", "offline.loss=sft", "offline.select.min_reward=1")
    after = [sample_logprob(tmp_path / "sft" / "model", stored_rows, s) for s in (0, 1)]
    assert after[0] - before[0] > 1.0  # the kept (right) replies' tokens became far likelier
    assert after[1] - before[1] < 0.5 * (after[0] - before[0])  # the dropped ones did not follow
    assert [r["policy/tokens"] for r in steps] == [0.0] * STEPS  # no policy-gradient token: all are sft
    assert all(r["sft/tokens"] == 8 * 4 for r in steps)  # 8 kept rows a step, 4 completion tokens each
    nll = [r["sft/nll"] for r in steps]
    assert nll[0] > nll[1] > nll[2], nll
    assert steps[0]["offline/select/kept"] == 16 and steps[0]["offline/select/dropped/min_reward"] == 16
    said = " ".join(printed.split())  # the table, however rich wrapped it
    assert "offline selection: min_reward=1 rows count read 32 dropped: min_reward 16 kept 16" in said, said


@pytest.fixture(scope="module")
def without_logprobs(stored_rows, tmp_path_factory) -> Path:
    """The stored rows as another model's samples would come: token ids and masks, no behaviour logprobs."""
    folder = tmp_path_factory.mktemp("imported")
    writer = ShardWriter(folder, "w000of001")
    for start in range(0, len(stored_rows), 2):
        writer.add_group([{**row, "completion_logprobs": []} for row in stored_rows[start:start + 2]])
    writer.flush()
    writer.write_manifest({"run_id": "r", "model": "other", "policy_version": 0, "sampling": {}, "envs": {},
                           "shard_files": writer.shard_files()})
    return folder


def test_rows_without_behaviour_logprobs_train_under_sft_and_are_refused_by_grpo(tiny_model, without_logprobs,
                                                                                 stored_rows, tmp_path):
    with pytest.raises(BadRowError, match=r"has no behaviour logprobs \(an imported run, or another model's "
                                          r"samples\): GRPO weighs each token by the policy's ratio to them; train "
                                          r"such rows with offline.loss=sft$"):
        train(tiny_model, without_logprobs, tmp_path / "grpo")
    with pytest.raises(SelectionError, match=r"^16 of the 16 selected stored rows have no behaviour logprobs .* so "
                                             r"train these rows with offline.loss=sft$"):
        train(tiny_model, without_logprobs, tmp_path / "grpo-selected", "offline.select.min_reward=1")
    steps, _ = train(tiny_model, without_logprobs, tmp_path / "sft", "offline.loss=sft")
    assert len(steps) == STEPS and all(r["sft/tokens"] > 0 and r["policy/skipped"] == 0 for r in steps)


def test_stored_sft_groups_mixed_into_online_steps_train_beside_the_fresh_grpo_ones(tiny_model, stored, tmp_path):
    """online.offline_fraction with offline.loss sft: each online step trains fresh groups by GRPO and stored ones
    by likelihood, in the same micro-batches (vLLM samples the fresh ones)."""
    steps, _ = train(tiny_model, stored, tmp_path / "mixed", "offline.loss=sft", "offline.steps=1",
                     "online.steps=2", "online.offline_fraction=0.5", "batch.groups_per_step=4",
                     "grpo.zero_variance=keep", "offline.select.min_reward=1")
    online = [r for r in steps if r["train/phase"] == 1]
    assert len(online) == 2 and steps[0]["train/phase"] == 0
    assert all(r["sft/tokens"] == 2 * 4 for r in online)  # 2 stored groups, their right reply of 4 tokens each
    assert all(r["policy/tokens"] > 0 for r in online)  # and the fresh rollouts' sampled tokens
