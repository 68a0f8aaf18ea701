"""The inner loop of a re-score (`score_batch`): rows decoded whole, `info` parsed fast, the collector paused."""

from __future__ import annotations

import gc
import math

import pyarrow as pa
import pytest

from hubgym.builders.registry import resolve_env
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
