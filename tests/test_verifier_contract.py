"""The verifier contract: loading checks, scoring (errors are data, not rewards), multi_turn episodes."""

import textwrap

import pytest

from hubgym.errors import VerifierLoadError
from hubgym.schemas import assistant, interaction, make_task, tool_call, tool_result, user
from hubgym.verifiers import actions_of, load_verifier

TASK = make_task("t", [user("q")], {"answer": "7", "target": 3})


def _load(tmp_path, source, name="verifier.py"):
    (tmp_path / name).write_text(textwrap.dedent(source))
    return load_verifier(name, relative_to=tmp_path, env="t")


def test_weighted_components_and_metrics(tmp_path):
    v = _load(tmp_path, """
        def correct(task, completion):
            return float(completion[-1]["content"] == task["info"]["answer"])
        def long(task, completion):
            return 0.5
        REWARDS = {correct: 2.0, long: 0.0}
        REWARD_RANGE = (0.0, 2.0)
    """)
    score = v.score(TASK, [assistant("7")])
    assert score.reward == 2.0 and score.components == {"correct": 1.0, "long": 0.5} and score.error is None
    assert v.reward_range == (0.0, 2.0) and len(v.sha256) == 64


def test_exception_is_recorded_not_scored(tmp_path):
    v = _load(tmp_path, """
        def boom(task, completion):
            raise KeyError("answer_missing")
        REWARDS = {boom: 1.0}
    """)
    score = v.score(TASK, [assistant("7")])
    assert score.reward is None
    assert score.error["message"] == "'answer_missing' (at verifier.py:3 in boom)"  # the line to read
    assert (score.error["boundary"], score.error["type"]) == ("verifier", "KeyError")


@pytest.mark.parametrize("value", ["'1.0'", "float('nan')", "True", "None"])
def test_non_float_reward_is_an_error(tmp_path, value):
    v = _load(tmp_path, f"def odd(task, completion):\n    return {value}\nREWARDS = {{odd: 1.0}}\n")
    score = v.score(TASK, [assistant("x")])
    assert score.reward is None and score.error["type"] == "TypeError"
    assert "must return a finite float" in score.error["message"]


@pytest.mark.parametrize("source, field, message", [
    ("X = 1\n", "REWARDS", "has no REWARDS dict"),
    ("def r(task):\n    return 1.0\nREWARDS = {r: 1.0}\n", "REWARDS", "is not a function of (task, completion)"),
    ("def r(t, c):\n    return 1.0\nREWARDS = {r: 'high'}\n", "REWARDS", "REWARDS weight for 'r' is 'high'"),
    ("def r(t, c):\n    return 1.0\nREWARDS = {r: 1.0}\nREWARD_RANGE = (1, 0)\n", "REWARD_RANGE", "is empty"),
    ("REWARDS = {}\ndef reset(task):\n    return 0, ''\n", "step", "defines only one of reset/step"),
    ("REWARDS = {}\ndef reset(task):\n    return 0, ''\ndef step(task, state):\n    return 0\n", "step",
     "step takes 2 arguments, expected 3"),
])
def test_load_errors_name_field_and_fix(tmp_path, source, field, message):
    with pytest.raises(VerifierLoadError) as err:
        _load(tmp_path, source)
    assert message in str(err.value) and err.value.where.field == field and err.value.fix


MDP = """
    def reset(task):
        return {"count": 0}, "Say 'up' until I stop you."
    def step(task, state, action):
        state = {"count": state["count"] + (action.strip() == "up")}
        done = state["count"] >= task["info"]["target"]
        return state, "stop" if done else f"count={state['count']}", 1.0 if done else 0.1, done
    def turns(task, completion):
        return float(sum(m["role"] == "assistant" for m in completion))
    REWARDS = {turns: 0.0}
    REWARD_RANGE = (0.0, 2.0)
"""


def test_multi_turn_episode_and_replay_score(tmp_path):
    v = _load(tmp_path, MDP)
    assert v.multi_turn
    episode = v.run_episode(TASK, ["up", "down", "up", "up", "up"])
    assert [s.observation for s in episode.steps] == ["count=1", "count=1", "count=2", "stop"]
    assert episode.done and episode.steps[-1].state == {"count": 3}
    score = v.score(TASK, episode.completion())
    assert score.components == {"turns": 4.0, "steps": pytest.approx(1.3)} and score.reward == pytest.approx(1.3)


def test_actions_skip_tool_calls():
    completion = [assistant(None, [tool_call("c", "calculator", "{}")]), tool_result("1", "c", "calculator"),
                  assistant("up"), user("count=1"), assistant("down")]
    assert actions_of(completion) == ["up", "down"]


def test_tool_call_shaping_counts_successful_calls_up_to_cap(tmp_path):
    v = _load(tmp_path, "def zero(t, c):\n    return 0.0\nREWARDS = {zero: 1.0}\n")
    spec = interaction("tool_use", max_turns=4, tools=["calculator"],
                       tool_rewards=[{"tool": "calculator", "reward": 0.1, "max_calls": 2}])
    task = make_task("t", [user("q")], {}, spec)
    ok = tool_result("3", "c", "calculator")
    failed = tool_result("Error: InvalidJSON: bad", "c", "calculator")
    assert v.score(task, [ok, failed]).components["tool_calls"] == pytest.approx(0.1)
    assert v.score(task, [ok, ok, ok]).reward == pytest.approx(0.2)


PARSER = """
    def parse_answer(task, completion):
        return completion[-1]["content"].partition("ANSWER:")[2] or None
    def correct(task, completion):
        return float((parse_answer(task, completion) or "").strip() == task["info"]["answer"])
    REWARDS = {correct: 1.0}
"""


@pytest.mark.parametrize("reply, found, reward", [("ANSWER: 7", 1.0, 1.0), ("ANSWER: 8", 1.0, 0.0),
                                                  ("ANSWER:   ", 0.0, 0.0), ("seven", 0.0, 0.0)])
def test_parse_answer_is_a_weight_zero_component(tmp_path, reply, found, reward):
    score = _load(tmp_path, PARSER).score(TASK, [assistant(reply)])
    assert score.components == {"answer_found": found, "correct": reward} and score.reward == reward


def test_parse_answer_stays_on_the_row_when_a_reward_raises(tmp_path):
    v = _load(tmp_path, PARSER.replace('task["info"]["answer"]', 'task["info"]["missing"]'))
    score = v.score(TASK, [assistant("ANSWER: 7")])
    assert score.reward is None and score.error["type"] == "KeyError" and score.components == {"answer_found": 1.0}


@pytest.mark.parametrize("source, field, message", [
    (PARSER.replace("return completion[-1]", "return 7 or completion[-1]"), None,
     "parse_answer returned 7; it must return the answer text or None"),
    ("def parse_answer(task):\n    return 'x'\ndef r(t, c):\n    return 1.0\nREWARDS = {r: 1.0}\n", "parse_answer",
     "is not a function of (task, completion)"),
    ("def answer_found(t, c):\n    return 1.0\nREWARDS = {answer_found: 0.0}\n", "REWARDS",
     "REWARDS has a function named 'answer_found', a component name hubgym reserves"),
])
def test_a_bad_parse_answer_is_a_load_error_or_a_row_error(tmp_path, source, field, message):
    if field is None:  # what it returns is only known when it runs: an error on the row, like a bad reward
        score = _load(tmp_path, textwrap.dedent(source)).score(TASK, [assistant("x")])
        assert score.reward is None and score.error["type"] == "TypeError" and score.error["message"] == message
        return
    with pytest.raises(VerifierLoadError) as err:
        _load(tmp_path, source)
    assert message in str(err.value) and err.value.where.field == field and err.value.fix


@pytest.mark.parametrize("env, no_answer", [("arithmetic", "I do not know."), ("gsm8k", "No idea, sorry."),
                                            ("calc_tools", "<answer>3 or 4</answer>"), ("reverse_text", "   ")])
def test_builtin_parsers_record_answer_found_and_change_no_reward(env, no_answer):
    import inspect
    from pathlib import Path

    from hubgym.envs import resolve_env
    from hubgym.verifiers.golden import load_golden

    builder = resolve_env(env)
    verifier = builder.verifier()
    missing = verifier.score(make_task(env, [user("q")], {"answer": "7", "target": "abc"}), [assistant(no_answer)])
    assert missing.components["answer_found"] == 0.0 and missing.reward == 0.0
    cases = load_golden(Path(inspect.getfile(builder)).parent / builder.GOLDEN, env)
    for case in (c for c in cases if c.completion is not None):
        score = verifier.score(case.task, case.completion)
        weighted = sum(w * score.components[n] for n, w in verifier.weights.items())
        shaping = score.components.get("tool_calls", 0.0)
        assert score.reward == pytest.approx(case.reward) == pytest.approx(weighted + shaping)
        answer = verifier.parse_answer(case.task, case.completion)
        assert score.components["answer_found"] == float(bool((answer or "").strip()))
    assert {c.components["answer_found"] for c in (verifier.score(c.task, c.completion) for c in cases)} == {0.0, 1.0}


def test_a_parse_answer_that_raises_is_named_by_the_conformance_failure(tmp_path):
    """check_score_never_raises names the part of the verifier that failed: parse_answer when it is the one."""
    from hubgym.conformance.checks import _failed_component

    path = tmp_path / "parse_raises.py"
    path.write_text("def parse_answer(task, completion):\n    raise ValueError('no')\n\n"
                    "def correct(task, completion):\n    return 1.0\n\nREWARDS = {correct: 1.0}\n")
    verifier = load_verifier(str(path), env="parse_raises")
    task = {"id": "t", "env": "parse_raises", "prompt": [], "info": {},
            "interaction": {"kind": "single_turn", "max_turns": 1, "tools": [], "tool_rewards": []}}
    score = verifier.score(task, [{"role": "assistant", "content": "x"}])
    assert score.error is not None and _failed_component(verifier, task, score) == "parse_answer"
