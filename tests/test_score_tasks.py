"""Tasks of stored rows decoded once per task (hubgym.score.tasks): rows share a task object only where every task
column holds exactly the same value, so each row's task is what decoding that row alone gives."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from hubgym.schemas.rollouts import ROLLOUT_SCHEMA
from hubgym.score.tasks import TASK_COLUMNS, decode_tasks, equal_rows

SCHEMA = pa.schema([ROLLOUT_SCHEMA.field(name) if name != "info" else pa.field("info", pa.string())
                    for name in TASK_COLUMNS])
MESSAGES = [[], [{"role": "user", "content": "q"}], [{"role": "user", "content": None}],
            [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
            [{"role": "assistant", "content": None,
              "tool_calls": [{"id": "c", "name": "calculator", "arguments": "{}"}]}]]
SHAPING = [[], [{"tool": "calculator", "reward": 0.1, "max_calls": 2}],
           [{"tool": "calculator", "reward": -0.0, "max_calls": 2}],
           [{"tool": "calculator", "reward": 0.0, "max_calls": 2}],
           [{"tool": "calculator", "reward": float("nan"), "max_calls": 2}]]


@st.composite
def task_rows(draw):
    """Rows whose task ids repeat while their other task columns may differ (forged or real groups)."""
    return {"task_id": draw(st.sampled_from(["a", "b", "c", None])), "env": draw(st.sampled_from(["e", "f"])),
            "prompt": draw(st.sampled_from(MESSAGES + [None])),
            "interaction": {"kind": "single_turn", "max_turns": draw(st.sampled_from([1, 2])),
                            "max_tokens": draw(st.sampled_from([None, 64])),
                            "tools": draw(st.sampled_from([[], ["calculator"], None])),
                            "tool_rewards": draw(st.sampled_from(SHAPING))},
            "info": draw(st.sampled_from(['{"answer": "7"}', '{"answer": "8"}', '{"answer":"7"}', "{}"]))}


def alone(row: dict) -> dict:
    """The task decoding one row on its own gives."""
    return {"id": row["task_id"], "env": row["env"], "prompt": row["prompt"], "interaction": row["interaction"],
            "info": json.loads(row["info"])}


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(task_rows(), max_size=16), start=st.integers(0, 3))
def test_each_row_gets_the_task_it_decodes_to_alone(rows, start):
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    sliced = table.slice(min(start, len(rows)))  # a slice: offsets into shared buffers
    expected = [alone(r) for r in sliced.to_pylist()]
    tasks = decode_tasks(sliced)
    assert [repr(t) for t in tasks] == [repr(t) for t in expected]  # repr: NaN and -0.0 compared as written
    for i, j in ((i, j) for i in range(len(tasks)) for j in range(i)):
        if tasks[i] is tasks[j]:
            assert repr(expected[i]) == repr(expected[j])


def test_the_rows_of_a_group_share_one_task_object():
    row = {"task_id": "a", "env": "e", "prompt": MESSAGES[3], "info": '{"answer": "7"}',
           "interaction": {"kind": "single_turn", "max_turns": 1, "max_tokens": None, "tools": [],
                           "tool_rewards": SHAPING[1]}}
    other = {**row, "task_id": "b"}
    forged = {**row, "info": '{"answer": "8"}'}  # the same id, another task: decoded on its own
    tasks = decode_tasks(pa.Table.from_pylist([row, other, row, forged, row], schema=SCHEMA))
    assert tasks[0] is tasks[2] is tasks[4] and tasks[1] is not tasks[0] and tasks[3] is not tasks[0]
    assert tasks[3]["info"] == {"answer": "8"}


def test_floats_compare_bit_for_bit_and_nulls_only_equal_nulls():
    floats = pa.array([0.0, -0.0, float("nan"), float("nan"), None, None])
    assert equal_rows(floats, np.array([1, 0, 3, 2, 5, 0])).tolist() == [False, False, True, True, True, False]
    lists = pa.array([[], None, ["x"], ["x"], ["x", None], ["x", None], ["x", "y"]]).slice(0)
    assert equal_rows(lists, np.array([1, 0, 3, 2, 5, 4, 5])).tolist() == [False, False, True, True, True, True,
                                                                              False]
