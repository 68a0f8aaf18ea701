"""Schemas: Arrow types, pandera value checks, and error messages that name the row and field."""

import pickle

import datasets
import pyarrow as pa
import pytest

from hubgym.errors import EnvContractError, SchemaError, Where
from hubgym.schemas import (
    MESSAGE, ROLLOUT_SCHEMA, TASK_SCHEMA, assistant, from_openai, interaction, make_task, rollouts_to_table,
    tasks_to_table, to_openai, tool_call, tool_result, user, validate_rollouts, validate_tasks,
)

WHERE = Where("demo", "easy", "train")


def _task(**kw):
    return make_task("demo", [user("What is 1+1?")], {"answer": "2"}, **kw)


def _rollout(**overrides):
    row = {
        "rollout_id": "r1", "run_id": "run", "task_id": "t1", "env": "demo", "group": "t1", "sample": 0,
        "prompt": [user("hi")], "completion": [assistant("ok")], "info": {"answer": "2"},
        "interaction": interaction(), "prompt_ids": [1, 2], "completion_ids": [3, 4, 5],
        "completion_mask": [1, 1, 1], "completion_logprobs": [-0.1, -0.2, -0.3], "tokens_consistent": True,
        "reward": 1.0, "metrics": [{"name": "correct", "value": 1.0}], "finish_reason": "stop", "truncated": False,
        "num_turns": 1, "error": None,
        "provenance": {"model": "m", "policy_version": 0, "sampling": "{}", "env_repo": None, "env_revision": None,
                       "verifier_module": "v", "verifier_sha256": "x", "engine": "vllm", "engine_version": "0",
                       "chat_template_sha256": None},
        "timings": {"generate_s": 0.1, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.1},
        "created_at": __import__("datetime").datetime(2026, 1, 1, tzinfo=__import__("datetime").timezone.utc),
    }
    return {**row, **overrides}


def test_task_ids_are_content_hashes():
    a, b = _task(), _task()
    assert a["id"] == b["id"] and a["id"].startswith("demo-")
    assert make_task("demo", [user("What is 1+2?")], {"answer": "3"})["id"] != a["id"]
    assert _task(spec=interaction("tool_use", max_turns=3, tools=["calculator"]))["id"] != a["id"]


def test_task_table_roundtrips_through_datasets():
    table = tasks_to_table([_task()])
    assert table.schema.equals(TASK_SCHEMA)
    ds = datasets.Dataset(table)
    assert ds[0]["info"] == {"answer": "2"} and ds[0]["prompt"][0]["role"] == "user"
    validate_tasks(table, WHERE)


def test_message_struct_matches_features():
    assert MESSAGE.field("tool_calls").type.value_type.names == ["id", "name", "arguments"]


def test_bad_role_names_row_and_field():
    bad = make_task("demo", [{"role": "robot", "content": "x"}], {"answer": "2"})
    with pytest.raises(SchemaError) as err:
        validate_tasks(tasks_to_table([_task(), bad]), WHERE)
    assert err.value.where == Where("demo", "easy", "train", bad["id"], "prompt.role")
    assert "Fix: every message needs role in" in str(err.value)


def test_bad_kind_and_turns_are_caught():
    bad = _task(spec=interaction("dance", max_turns=0))
    with pytest.raises(SchemaError, match=r"interaction\.(kind|max_turns)"):
        validate_tasks(tasks_to_table([bad]), WHERE)


def test_wrong_column_type_is_named():
    table = tasks_to_table([_task()])
    table = table.set_column(table.schema.get_field_index("tags"), "tags", pa.array(["x"]))
    with pytest.raises(SchemaError, match=r"task column 'tags' has type string, expected list<item: string>"):
        validate_tasks(table, WHERE)


def test_missing_column_is_named():
    with pytest.raises(SchemaError, match=r"task column 'difficulty' is missing"):
        validate_tasks(tasks_to_table([_task()]).drop_columns(["difficulty"]), WHERE)


def test_duplicate_ids_fail():
    with pytest.raises(SchemaError, match=r"'id'"):
        validate_tasks(tasks_to_table([_task(), _task()]), WHERE)


def test_rollout_table_validates_and_catches_length_mismatch():
    table = rollouts_to_table([_rollout()])
    assert table.schema.equals(ROLLOUT_SCHEMA)
    validate_rollouts(table)
    with pytest.raises(SchemaError) as err:
        validate_rollouts(rollouts_to_table([_rollout(rollout_id="r2", completion_mask=[1, 1])]))
    assert err.value.where.row == "r2" and err.value.where.field == "completion_mask"


def test_rollout_without_reward_needs_error():
    with pytest.raises(SchemaError, match="reward"):
        validate_rollouts(rollouts_to_table([_rollout(reward=None)]))
    err = {"boundary": "verifier", "type": "ValueError", "message": "boom"}
    validate_rollouts(rollouts_to_table([_rollout(reward=None, error=err)]))


def test_openai_roundtrip_keeps_tool_calls():
    msg = assistant(None, [tool_call("c1", "calculator", '{"expression": "1+1"}')])
    wire = to_openai(msg)
    assert wire["tool_calls"][0]["function"]["name"] == "calculator"
    assert from_openai(wire) == msg
    assert from_openai(to_openai(tool_result("2", "c1", "calculator"))) == tool_result("2", "c1", "calculator")


def test_errors_pickle_with_fields():
    err = EnvContractError("bad", Where("e", "c", "s", "r", "f"), "do this", check="check_x")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.where == err.where and back.check == "check_x"
    assert str(err) == "check_x: bad [env='e' config='c' split='s' row='r' field='f']. Fix: do this"
