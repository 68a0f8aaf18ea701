"""The inner loop of a re-score (`score_batch`): rows decoded whole, `info` parsed fast, the collector paused."""

from __future__ import annotations

import gc
import json
import math

import pyarrow as pa
import pytest

from hubgym.envs import build_tasks
from hubgym.envs import resolve_env
from hubgym.schemas.rollouts import ROLLOUT_SCHEMA
from hubgym.schemas.tasks import parse_json
from hubgym.score.choice import VerifierChoice
from hubgym.score.scoring import collector_paused, score_batch

INTERACTION = {"kind": "single_turn", "max_turns": 1, "max_tokens": 64, "tools": [], "tool_rewards": []}


def arithmetic_batch(infos: list[str], replies: list[str]) -> pa.RecordBatch:
    rows = len(infos)
    return pa.RecordBatch.from_pydict({
        "task_id": [f"t{i}" for i in range(rows)], "env": ["arithmetic"] * rows,
        "prompt": [[{"role": "user", "content": "What is 3 + 4?"}]] * rows,
        "completion": [[{"role": "assistant", "content": reply}] for reply in replies],
        "info": infos, "interaction": [INTERACTION] * rows,
        "error": pa.array([None] * rows, pa.struct([("boundary", pa.string()), ("type", pa.string()),
                                                   ("message", pa.string())])),
        "finish_reason": ["stop"] * rows, "metrics": pa.array([[]] * rows, ROLLOUT_SCHEMA.field("metrics").type),
    })


def test_score_batch_scores_rows_whose_info_json_msgspec_refuses():
    # Python's json writes NaN for a float nan; msgspec refuses it, so parse_json falls back to json.
    infos = ['{"answer": "7", "expression": "3 + 4"}', '{"answer": "7", "expression": "3 + 4", "spread": NaN}']
    batch = arithmetic_batch(infos, ["<answer>7</answer>", "<answer>8</answer>"])
    spec = VerifierChoice(None, None).spec("arithmetic")

    scores = score_batch({"arithmetic": spec}, batch).to_pylist()

    assert [s["rescore_reward"] for s in scores] == [1.0, 0.0]
    assert [s["rescore_error"] for s in scores] == [None, None]
    expected = resolve_env("arithmetic").verifier().score(
        {"id": "t0", "env": "arithmetic", "prompt": [], "interaction": INTERACTION, "info": {"answer": "7"}},
        [{"role": "assistant", "content": "<answer>7</answer>"}])
    assert {m["name"]: m["value"] for m in scores[0]["rescore_metrics"]} == {
        **{f"reward/{k}": v for k, v in expected.components.items()}, "success": 1.0}
    assert gc.isenabled()


def test_parse_json_matches_json_loads_including_what_only_python_writes():
    assert parse_json('{"a": [1, 2.5, "x", null, true], "b": {"c": 123456789012345678901234567890}}') == {
        "a": [1, 2.5, "x", None, True], "b": {"c": 123456789012345678901234567890}}
    parsed = parse_json('{"low": -Infinity, "bad": NaN}')
    assert parsed["low"] == -math.inf and math.isnan(parsed["bad"])
    with pytest.raises(ValueError):
        parse_json('{"a": ')


def test_collector_paused_restores_the_collector_even_when_the_block_raises():
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("a verifier bug")
    assert gc.isenabled()

    gc.disable()  # a caller that turned it off keeps it off
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_reply_cut_short_is_not_an_env_action_when_scored_stored_or_rescored():
    """The rollout loop never steps a multi_turn reply cut at max_tokens; scoring, re-scoring and replay leave it
    out the same way (one definition, last_reply_cut), so a cut winning guess earns nothing anywhere."""
    from hubgym.schemas import assistant, user
    from hubgym.score.scoring import SCORED_COLUMNS
    from hubgym.score.choice import VerifierSpec
    from hubgym.verifiers.contract import last_reply_cut

    task = build_tasks("wordle", "default")["test"][0]
    verifier = resolve_env("wordle").verifier()
    secret = task["info"]["secret"]
    completion = [assistant(f"<guess>{secret}</guess>")]  # would win, but the reply was cut

    assert verifier.score(task, completion).reward > 0
    assert verifier.score(task, completion, cut=True).reward == 0.0
    assert last_reply_cut(completion, "length", 0) and not last_reply_cut(completion, "stop", 0)
    stepped = completion + [user("obs")]
    assert not last_reply_cut(stepped, "length", 1)  # ends in an observation: the reply was stepped
    assert not last_reply_cut(completion, "context_length", 1)  # out of context before the next reply
    assert last_reply_cut(completion, "context_length", None)

    row = {"task_id": task["id"], "env": "wordle", "prompt": task["prompt"], "completion": completion,
           "info": json.dumps(task["info"]), "interaction": task["interaction"], "error": None,
           "finish_reason": "length", "metrics": [{"name": "reward/steps", "value": 0.0}]}
    schema = pa.schema([pa.field(c, pa.string()) if c == "info" else ROLLOUT_SCHEMA.field(c) for c in SCORED_COLUMNS])
    batch = pa.RecordBatch.from_pylist([row], schema=schema)  # as `slim` lays it out: info as its JSON text
    spec = VerifierSpec.of(verifier, "wordle", "registry")
    assert score_batch({"wordle": spec}, batch).column("rescore_reward").to_pylist() == [0.0]
