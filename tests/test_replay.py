"""Replay: real multi_turn rollouts (vLLM, tiny model) reproduce exactly; tampered rows and a template that
rewrites earlier turns are caught, each at the right turn, field or token."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from hubgym.builders.registry import BUILTIN_ENVS

from hubgym.envs import resolve_env
from hubgym.cli import app
from hubgym.hub.rollouts import iter_rollouts, push_rollouts
from hubgym.engines import SamplingArgs, VLLMEngine
from hubgym.rollout.run import RolloutConfig, run_rollouts
from hubgym.rollout.tokens import ChatRenderer, TokenRecord
from hubgym.rollout.writer import ShardWriter
from hubgym.schemas import assistant, user
from hubgym.score.replay import audit_tokens, replay, replay_rollout

pytestmark = pytest.mark.slow
MULTI_TURN = [name for name in BUILTIN_ENVS if resolve_env(name).verifier().multi_turn]
# Every reply reasons, then acts in the env's format, so the random model plays whole multi-step episodes.
REASON_THEN_ACT = r"<think>[a-z]{1,4}</think>(<guess>[a-z]{5}</guess>|<move>[1-9]</move>)"
STRIP_TEMPLATE = Path(__file__).parent / "templates" / "strip_past_reasoning.jinja"
CLI_ENV = {"COLUMNS": "240"}


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory) -> dict[str, Path]:
    """Three real runs on one engine: whole episodes; replies cut by max_tokens; a context that runs out."""
    out = tmp_path_factory.mktemp("replay")
    engine = VLLMEngine(str(tiny_model), max_model_len=2048, enforce_eager=True)
    settings = {"full": (64, 2048), "cut": (6, 2048), "context": (64, 330)}  # name: (max_tokens, max_model_len)
    for name, (max_tokens, max_model_len) in settings.items():
        run_rollouts(RolloutConfig(envs=MULTI_TURN, model=str(tiny_model), out=str(out / name), n=2, limit=3,
                                   sampling=SamplingArgs(max_tokens=max_tokens, regex=REASON_THEN_ACT),
                                   max_model_len=max_model_len), engine=engine, progress=False)
    engine.close()
    return {name: out / name for name in settings}


@pytest.fixture(scope="module")
def rows(runs) -> list[dict]:
    return list(iter_rollouts([runs["full"]]))


@pytest.fixture(scope="module")
def stripping_tokenizer(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    tokenizer.chat_template = STRIP_TEMPLATE.read_text()
    return tokenizer


def test_the_builtin_multi_turn_envs_are_covered():
    assert {"wordle", "tictactoe"} <= set(MULTI_TURN)


def test_every_stored_multi_turn_rollout_reproduces(runs, rows, tiny_model):
    report = replay(runs["full"], model=tiny_model)
    assert report.counts() == {"rollouts": 6 * len(MULTI_TURN), "replayed": 6 * len(MULTI_TURN),
                               "reproduced": 6 * len(MULTI_TURN), "diverged": 0, "token_audited": 6 * len(MULTI_TURN),
                               "token_audit_failures": 0}, report.diverged + report.token_failures
    for env in MULTI_TURN:  # real multi-step episodes, not one-step ones
        assert max(r.steps for r in report.results if r.env == env) >= 2
    for row in rows:  # the per-step rewards are stored, one per env step, and add up to the steps component
        metrics = {m["name"]: m["value"] for m in row["metrics"]}
        steps = [v for k, v in metrics.items() if k.startswith("step/")]
        assert len(steps) == row["num_turns"] and sum(steps) == pytest.approx(metrics["reward/steps"])


def test_cut_replies_and_a_context_that_runs_out_reproduce(runs, tiny_model):
    cut = replay(runs["cut"], model=tiny_model)
    assert {r["finish_reason"] for r in iter_rollouts([runs["cut"]])} == {"length"}
    assert cut.ok and cut.counts()["reproduced"] == 6 * len(MULTI_TURN)
    assert {r.steps for r in cut.results} == {0}  # a reply cut by max_tokens is never an env action
    context = replay(runs["context"], model=tiny_model)
    finished = {r["finish_reason"] for r in iter_rollouts([runs["context"]])}
    assert "context_length" in finished, finished
    assert context.ok and context.counts()["reproduced"] == 6 * len(MULTI_TURN), context.diverged
    assert max(r.steps for r in context.results) >= 1


def _multi_step(rows: list[dict], env: str | None = None) -> dict:
    """A copy of a row with at least two observations in its completion."""
    return copy.deepcopy(next(r for r in rows if sum(m["role"] == "user" for m in r["completion"]) >= 2
                              and env in (None, r["env"])))


def _write(rows: list[dict], folder: Path) -> Path:
    writer = ShardWriter(folder, "w000of001")
    writer.add_group(rows)
    writer.flush()
    return folder


def test_a_changed_observation_is_caught_at_its_turn(rows, tmp_path):
    row = _multi_step(rows)
    second = [i for i, m in enumerate(row["completion"]) if m["role"] == "user"][1]
    turn = sum(m["role"] == "assistant" for m in row["completion"][:second])
    row["completion"][second]["content"] += " (edited)"
    [result] = replay(_write([row], tmp_path / "tampered")).results  # through a real Arrow shard
    assert result.rollout_id == row["rollout_id"] and turn == 2
    assert (result.divergence.turn, result.divergence.field) == (2, "observation")
    assert result.divergence.stored.endswith("(edited)") and not result.divergence.replayed.endswith("(edited)")


def test_a_changed_reset_observation_is_caught_at_turn_0(rows):
    row = _multi_step(rows, "tictactoe")  # wordle's reset says nothing; tictactoe's shows the board
    row["prompt"][-1]["content"] = row["prompt"][-1]["content"].replace("Your move", "Your go")
    divergence = replay_rollout(row, resolve_env("tictactoe").verifier()).divergence
    assert (divergence.turn, divergence.field) == (0, "observation") and "Your go" in divergence.stored


def test_a_changed_step_reward_is_caught_at_its_turn(rows, tmp_path):
    row = _multi_step(rows)
    [metric] = [m for m in row["metrics"] if m["name"] == "step/1/reward"]
    metric["value"] += 0.5
    [result] = replay(_write([row], tmp_path / "tampered")).results
    assert (result.divergence.turn, result.divergence.field) == (2, "reward")
    assert result.divergence.stored == metric["value"] and result.divergence.replayed == metric["value"] - 0.5


def test_a_missing_or_extra_step_reward_is_caught(rows):
    row = _multi_step(rows)
    verifier = resolve_env(row["env"]).verifier()
    row["metrics"] = [m for m in row["metrics"] if m["name"] != "step/0/reward"]
    divergence = replay_rollout(row, verifier).divergence
    assert (divergence.turn, divergence.field, divergence.stored) == (1, "reward", None)
    row = _multi_step(rows)
    row["metrics"].append({"name": f"step/{row['num_turns']}/reward", "value": 0.0})
    divergence = replay_rollout(row, verifier).divergence
    assert (divergence.turn, divergence.field) == (row["num_turns"] + 1, "reward")


def test_rows_written_before_step_rewards_were_stored_still_replay_their_observations(rows):
    row = _multi_step(rows)
    row["metrics"] = [m for m in row["metrics"] if not m["name"].startswith("step/")]
    verifier = resolve_env(row["env"]).verifier()
    assert replay_rollout(row, verifier).divergence is None
    row["completion"][1]["content"] += "!"  # the first observation
    divergence = replay_rollout(row, verifier).divergence
    assert (divergence.turn, divergence.field) == (1, "observation")


def test_a_wrong_turn_count_and_a_wrong_ending_are_caught(rows):
    row = _multi_step(rows)
    verifier = resolve_env(row["env"]).verifier()
    row["num_turns"] += 1
    divergence = replay_rollout(row, verifier).divergence
    assert (divergence.field, divergence.stored, divergence.replayed) == ("num_turns", row["num_turns"],
                                                                           row["num_turns"] - 1)
    ended = [r for r in rows if r["finish_reason"] == "stop" and r["num_turns"] >= 2]  # the env ended these
    assert ended, "no episode ran to its end: raise the run's limits"
    row = copy.deepcopy(ended[0])
    verifier = resolve_env(row["env"]).verifier()
    n = row["num_turns"]
    shortened = {**row, "completion": row["completion"][:-2], "num_turns": n - 1,  # drops the last action + observation
                 "metrics": [m for m in row["metrics"] if m["name"] != f"step/{n - 1}/reward"]}
    divergence = replay_rollout(shortened, verifier).divergence
    assert (divergence.turn, divergence.field, divergence.stored, divergence.replayed) == (n - 1, "done", True, False)
    more = [assistant("<move>1</move>"), user("more")]
    extended = {**row, "num_turns": n + 1, "completion": row["completion"] + more}
    divergence = replay_rollout(extended, verifier).divergence
    assert (divergence.turn, divergence.field, divergence.stored, divergence.replayed) == (n, "done", False, True)


def test_rows_as_an_iterable_and_one_rollout_by_id(rows):
    report = replay(iter(rows), rollout=rows[3]["rollout_id"])
    assert [r.rollout_id for r in report.results] == [rows[3]["rollout_id"]] and report.ok


def _loop_row(renderer: ChatRenderer) -> dict:
    """The token record the rollout loop builds for two reasoning turns and one observation (no engine needed)."""
    prompt, obs = [user("hi")], user("obs")
    first, second = assistant("<think>r1</think>a1"), assistant("<think>r2</think>a2")
    record = TokenRecord(renderer.prompt_ids(prompt, None))
    for reply, new in ((first, [obs]), (second, [])):
        ids = renderer.encode(reply["content"] + renderer.eos_text)
        record.add_model(ids, [0.0] * len(ids))
        if new:
            bridge, problem = renderer.bridge(prompt + ([] if reply is first else [first, obs]), reply, new, None, True)
            record.add_env(bridge)
            record.consistent = record.consistent and problem is None
    return {"prompt": prompt, "completion": [first, obs, second], "prompt_ids": record.prompt_ids,
            "completion_ids": record.completion_ids, "completion_mask": record.mask, "interaction": {"tools": []},
            "tokens_consistent": record.consistent}


def test_token_audit_flags_a_template_that_strips_past_reasoning(tiny_model, stripping_tokenizer):
    plain = ChatRenderer(AutoTokenizer.from_pretrained(str(tiny_model)))
    stripping = ChatRenderer(stripping_tokenizer)
    no_reasoning = [user("hi"), assistant("a1"), user("obs"), assistant("a2")]
    assert stripping.render(no_reasoning, None, add_generation_prompt=True) == plain.render(
        no_reasoning, None, add_generation_prompt=True)  # the two templates differ only in what they strip
    row = _loop_row(stripping)  # made with the stripping template, as a Qwen3-style model's rollouts are
    assert row["tokens_consistent"] is False  # the loop saw it too, and kept the sampled history
    audit = audit_tokens(row, stripping)
    # The first token of the first reply: the template renders "a1" where "<think>r1</think>a1" was sampled.
    assert (audit.index, audit.turn, audit.part) == (len(row["prompt_ids"]), 1, "model")
    assert audit.stored.split("⟨here⟩")[1].startswith("<think>r1")
    assert audit.rendered.split("⟨here⟩")[1].startswith("a1")
    assert audit_tokens(row, plain).ok and audit_tokens(_loop_row(plain), plain).ok


def test_token_audit_of_real_rollouts_under_the_stripping_template(rows, stripping_tokenizer):
    flagged = 0
    for row in rows:
        audit = audit_tokens(row, stripping_tokenizer)
        roles = [m["role"] for m in row["completion"]]
        if "user" not in roles or roles.index("assistant") > len(roles) - 1 - roles[::-1].index("user"):
            assert audit.ok  # no reply before the last observation: nothing is stripped
            continue
        flagged += 1
        first = row["completion_mask"].index(1)  # == 0: the reply is the first thing after the prompt
        reply = row["completion_ids"][first:row["completion_mask"].index(0)]
        # Where "<think>..." and the stripped "<guess>"/"<move>" part ways: the reply's 2nd character.
        second_char = next(j for j in range(len(reply)) if len(stripping_tokenizer.decode(reply[:j + 1])) >= 2)
        assert (audit.index, audit.turn, audit.part) == (len(row["prompt_ids"]) + first + second_char, 1, "model")
    assert flagged >= len(rows) // 2


def test_replay_cli_exit_codes(runs, rows, tmp_path, tiny_model, stripping_tokenizer):
    ok = CliRunner().invoke(app, ["replay", str(runs["full"]), str(runs["cut"]), "--model", str(tiny_model)],
                            env=CLI_ENV)
    assert ok.exit_code == 0, ok.output
    assert all(env in ok.output for env in MULTI_TURN) and "reproduced" in ok.output
    assert "first divergences" not in ok.output and "token audit:" not in ok.output

    row = _multi_step(rows)
    [m for m in row["metrics"] if m["name"] == "step/0/reward"][0]["value"] = 99.0
    bad = CliRunner().invoke(app, ["replay", str(_write([row], tmp_path / "tampered"))], env=CLI_ENV)
    assert bad.exit_code == 1 and "first divergences" in bad.output and "reward" in bad.output
    assert row["rollout_id"] in bad.output and "99.0" in bad.output

    stripping_dir = tmp_path / "stripping-model"
    stripping_tokenizer.save_pretrained(str(stripping_dir))
    audit = CliRunner().invoke(app, ["replay", str(runs["full"]), "--model", str(stripping_dir)], env=CLI_ENV)
    assert audit.exit_code == 1 and "token audit" in audit.output and "first divergences" not in audit.output

    one = CliRunner().invoke(app, ["replay", str(runs["full"]), "--rollout", rows[0]["rollout_id"]], env=CLI_ENV)
    assert one.exit_code == 0 and rows[0]["env"] in one.output
    missing = CliRunner().invoke(app, ["replay", str(runs["full"]), "--rollout", "no-such-id"], env=CLI_ENV)
    assert missing.exit_code == 1 and "no rollout 'no-such-id'" in missing.output


def test_replay_streams_a_run_from_a_hub(runs, tmp_path):
    pushed = push_rollouts(runs["full"], "me/rollouts", hub=tmp_path / "hub")  # a local hub folder
    report = replay(pushed.ref, hub=str(tmp_path / "hub"))
    assert report.ok and report.counts()["reproduced"] == 6 * len(MULTI_TURN)


def test_replay_needs_the_envs_verifier(rows):
    row = {**copy.deepcopy(rows[0]), "env": "not_an_env"}
    with pytest.raises(LookupError, match="'not_an_env'.*--verifier not_an_env=MODULE"):
        replay([row])
    assert replay([row], verifier=f"hubgym.verifiers.{rows[0]['env']}").counts()["reproduced"] == 1
