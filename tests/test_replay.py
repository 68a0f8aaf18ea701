"""Replay: real multi_turn rollouts (vLLM) reproduce exactly; tampered ones and rewriting templates are caught."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from hubgym.hub.rollouts import iter_rollout_rows
from hubgym.rollout.run import RolloutConfig, run_rollouts
from hubgym.rollout.engines import SamplingArgs
from hubgym.rollout.tokens import ChatRenderer
from hubgym.schemas import assistant, user
from hubgym.score.replay import audit_tokens, replay
from hubgym.rollout.writer import ShardWriter

pytestmark = pytest.mark.slow
MULTI_TURN = ["wordle", "tictactoe"]


@pytest.fixture(scope="module")
def run(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("mt")
    # Replies constrained to an action's format, so the random model plays whole multi-step episodes.
    actions = r"<guess>[a-z]{5}</guess>|<move>[1-9]</move>"
    run_rollouts(RolloutConfig(envs=MULTI_TURN, model=str(tiny_model), out=str(out), n=2, limit=3,
                               sampling=SamplingArgs(max_tokens=16, regex=actions), max_model_len=2048),
                 progress=False)
    return out


def test_every_stored_multi_turn_rollout_reproduces(run, tiny_model):
    report = replay([run], model=tiny_model)
    counts = report.counts()
    assert counts["rollouts"] == 12 and counts["replayed"] >= 10  # a row that failed has nothing to replay
    assert counts["diverged"] == 0 and counts["token_audit_failures"] == 0, report.diverged
    rows = list(iter_rollout_rows([run]))
    assert any(any(m["name"] == "step/1/reward" for m in r["metrics"]) for r in rows)  # per-step rewards stored


def _tampered(run, tmp_path, change) -> str:
    rows = [r for r in iter_rollout_rows([run]) if r["interaction"]["kind"] == "multi_turn" and r["error"] is None
            and sum(m["role"] == "user" for m in r["completion"]) >= 2]
    row = rows[0]
    change(row)
    writer = ShardWriter(tmp_path / "tampered", "w000of001")
    writer.add_group([row])
    writer.flush()
    return row["rollout_id"]


def test_a_changed_observation_is_caught_at_its_turn(run, tmp_path):
    def edit(row):
        second = [i for i, m in enumerate(row["completion"]) if m["role"] == "user"][1]
        row["completion"][second]["content"] += " (edited)"

    rid = _tampered(run, tmp_path, edit)
    [result] = replay([tmp_path / "tampered"]).results
    assert result.rollout_id == rid and result.divergence is not None
    assert (result.divergence.turn, result.divergence.field) == (2, "observation")
    assert result.divergence.stored.endswith("(edited)")


def test_a_changed_step_reward_is_caught(run, tmp_path):
    def edit(row):
        for m in row["metrics"]:
            if m["name"] == "step/0/reward":
                m["value"] += 0.5

    _tampered(run, tmp_path, edit)
    [result] = replay([tmp_path / "tampered"]).results
    assert (result.divergence.turn, result.divergence.field) == (1, "reward")


def test_token_audit_flags_a_template_that_strips_past_reasoning(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    consistent = ChatRenderer(tokenizer)
    prompt = [user("hi")]
    completion = [assistant("<think>r1</think>a1"), user("obs"), assistant("<think>r2</think>a2")]
    ids = consistent.encode(consistent.render(prompt + completion, None, add_generation_prompt=False))
    row = {"prompt": prompt, "completion": completion, "prompt_ids": ids[:3], "completion_ids": ids[3:],
           "interaction": {"tools": []}}
    assert audit_tokens(row, consistent) is None
    stripping = AutoTokenizer.from_pretrained(str(tiny_model))
    stripping.chat_template = tokenizer.chat_template.replace(
        "{% if message.content %}{{ message.content }}{% endif -%}",
        "{% if message.content %}{{ message.content if loop.last else message.content.split('</think>')[-1] }}"
        "{% endif -%}")
    assert stripping.chat_template != tokenizer.chat_template
    divergence = audit_tokens(row, ChatRenderer(stripping))
    assert divergence is not None and (divergence.turn, divergence.field) == (1, "token")
    assert "<think>r1" in divergence.stored and "<think>r1" not in divergence.replayed


def test_replay_cli_exit_codes(run, tmp_path, tiny_model):
    from typer.testing import CliRunner

    from hubgym.cli import app

    ok = CliRunner().invoke(app, ["replay", str(run), "--model", str(tiny_model)], env={"COLUMNS": "200"})
    assert ok.exit_code == 0, ok.output
    assert "reproduced" in ok.output
    _tampered(run, tmp_path, lambda row: row["metrics"].append({"name": "step/0/reward", "value": 99.0})
              if not any(m["name"] == "step/0/reward" for m in row["metrics"]) else
              [m.update(value=99.0) for m in row["metrics"] if m["name"] == "step/0/reward"])
    bad = CliRunner().invoke(app, ["replay", str(tmp_path / "tampered")], env={"COLUMNS": "200"})
    assert bad.exit_code == 1 and "reward" in bad.output
