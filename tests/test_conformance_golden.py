"""Golden cases of multi_turn envs state their interaction: never a silent single_turn task with max_turns 1."""

import json
import re

import pytest

from hubgym.errors import EnvContractError
from hubgym.verifiers.golden import load_golden

SPEC = {"kind": "multi_turn", "max_turns": 3}
ACTIONS = {"name": "plays", "task": {"info": {}, "interaction": SPEC}, "actions": ["a", "b"], "reward": 1.0}
STORED = {"name": "stored", "task": {"info": {}, "interaction": SPEC},
          "completion": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "ok"}], "reward": 1.0}


def _write(tmp_path, *cases):
    path = tmp_path / "golden.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return path


def _without(case, key):
    return {**case, "task": {k: v for k, v in case["task"].items() if k != key}}


def test_well_formed_multi_turn_cases_load_with_their_spec(tmp_path):
    cases = load_golden(_write(tmp_path, ACTIONS, STORED), env="guess", kind="multi_turn")
    assert [(c.name, c.task["interaction"]["kind"], c.task["interaction"]["max_turns"]) for c in cases] == [
        ("plays", "multi_turn", 3), ("stored", "multi_turn", 3)]


@pytest.mark.parametrize("case, kind, message", [
    (_without(ACTIONS, "interaction"), "multi_turn", "golden case 'plays' (golden.jsonl:2) gives actions but has no "
     "task.interaction, so it would run as a single_turn task with max_turns 1 [env='guess' field='golden.jsonl:2 "
     "task.interaction']"),
    (_without(ACTIONS, "interaction"), None, "golden case 'plays' (golden.jsonl:2) gives actions but has no "
     "task.interaction"),  # actions alone imply multi_turn, whatever loads the file
    (_without(STORED, "interaction"), "multi_turn", "golden case 'stored' (golden.jsonl:2) belongs to a multi_turn "
     "env but has no task.interaction, so it would run as a single_turn task with max_turns 1"),
    ({**ACTIONS, "task": {"info": {}, "interaction": {"kind": "single_turn"}}}, "multi_turn",
     "golden case 'plays' (golden.jsonl:2) gives actions, but its task.interaction.kind is 'single_turn' "
     "[env='guess' field='golden.jsonl:2 task.interaction.kind']"),
    ({**ACTIONS, "actions": ["a", "b", "c", "d"]}, "multi_turn",
     "golden case 'plays' (golden.jsonl:2) gives 4 actions, but its task.interaction.max_turns is 3: the rollout "
     "loop would end the episode after 3 [env='guess' field='golden.jsonl:2 task.interaction.max_turns']"),
])
def test_a_multi_turn_case_without_a_fitting_interaction_names_file_case_and_field(tmp_path, case, kind, message):
    path = _write(tmp_path, STORED, case)
    with pytest.raises(EnvContractError, match="^" + re.escape(message)) as err:
        load_golden(path, env="guess", kind=kind)
    assert "Fix: " in str(err.value)


def test_single_turn_cases_may_leave_the_interaction_out(tmp_path):
    case = {"name": "right", "task": {"info": {"answer": "4"}},
            "completion": [{"role": "assistant", "content": "4"}], "reward": 1.0}
    (loaded,) = load_golden(_write(tmp_path, case), env="sums", kind="single_turn")
    assert loaded.task["interaction"]["kind"] == "single_turn"
