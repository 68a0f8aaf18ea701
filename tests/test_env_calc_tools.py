"""The `calc_tools` env: real builds whose answers are re-derived independently, golden cases,
exact big-integer answers, and tool shaping (capped, failed calls earn nothing)."""

import json
import re

import pytest
import sympy

import hubgym
from hubgym.builders.calc_tools import GENERATORS, CalcTools
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import assistant, interaction, make_task, tool_call, tool_result, user, validate_tasks
from hubgym.tools import make_toolbox
from hubgym.verifiers import calc_tools as cv

VERIFIER = CalcTools.verifier()


def _task(answer="56088", tool="calculator"):
    spec = interaction("tool_use", max_turns=4, tools=[tool],
                       tool_rewards=[{"tool": tool, "reward": 0.1, "max_calls": 2}])
    return make_task("calc_tools", [user("q")], {"kind": "multiply", "answer": answer}, spec)


def _calls(n, tool="calculator", content="56088"):
    out = []
    for i in range(n):
        out += [assistant(None, [tool_call(f"c{i}", tool, '{"expression": "123*456"}')]),
                tool_result(content, f"c{i}", tool)]
    return out


def _expected(kind, question):
    """The answer re-derived from the question's numbers, by other means than the builder's."""
    n = [int(x) for x in re.findall(r"\d+", question)]
    return {
        "multiply": lambda: n[0] * n[1], "divide": lambda: n[0] // n[1], "power": lambda: n[0] ** n[1],
        "sum_of_products": lambda: n[0] * n[1] + n[2] * n[3],
        "squares": lambda: sum(i * i for i in range(1, n[1] + 1)),
        "cubes": lambda: sum(i ** 3 for i in range(1, n[1] + 1)),
        "primes": lambda: int(sympy.primepi(n[0] - 1)), "fibonacci": lambda: int(sympy.fibonacci(n[-1])),
        "digits_of_power": lambda: sum(map(int, str(2 ** n[1]))),
    }[kind]()


@pytest.fixture(scope="module", params=CalcTools.config_names())
def built(request):
    return request.param, hubgym.build_tasks("calc_tools", request.param)


@pytest.mark.slow
def test_builds_valid_rows_with_correct_answers(built):
    config, ds = built
    for split, rows in ds.items():
        validate_tasks(rows.data.table, Where("calc_tools", config, split))
        assert len(rows) == len(set(rows["id"])) == {"train": 1000, "test": 100}[split]
        assert {json.dumps(i, sort_keys=True) for i in rows["interaction"]} == {json.dumps(interaction(
            "tool_use", max_turns=4, tools=[config], tool_rewards=[{"tool": config, "reward": 0.1, "max_calls": 2}]),
            sort_keys=True)}
        assert {i["kind"] for i in rows["info"]} == set(GENERATORS[config])  # every kind is drawn
        for prompt, info in zip(rows["prompt"], rows["info"]):
            assert int(info["answer"]) == _expected(info["kind"], prompt[-1]["content"]), prompt[-1]["content"]
            assert config in prompt[0]["content"]


@pytest.mark.slow
def test_ids_are_deterministic():
    first, second = (hubgym.build_tasks("calc_tools", "python")["test"] for _ in range(2))
    assert first["id"] == second["id"] and first["info"] == second["info"]


def test_unknown_tool_names_field_and_fix(tmp_path):
    builder = CalcTools(config_name="calculator", tool="abacus", cache_dir=str(tmp_path))
    with pytest.raises(EnvContractError) as err:
        next(builder.generate_tasks("train", size=1, seed=0))
    assert err.value.where == Where("calc_tools", "calculator", "train", field="tool")
    assert "one of ['calculator', 'python']" in err.value.fix


def test_golden_cases_score_as_declared():
    cases = CalcTools.golden_cases()
    assert VERIFIER.reward_range == (0.0, 1.2)
    assert {c.reward for c in cases} >= set(VERIFIER.reward_range)
    for case in cases:
        assert VERIFIER.score(case.task, case.completion).reward == pytest.approx(case.reward), case.name


def test_golden_tool_messages_match_the_real_calculator():
    """The stored tool results are what the calculator really answers (errors: an 'Error: ' message)."""
    for case in CalcTools.golden_cases():
        if case.task["interaction"]["tools"] != ["calculator"]:
            continue
        box = make_toolbox(["calculator"], case.task)
        results = {m["tool_call_id"]: m["content"] for m in case.completion if m["role"] == "tool"}
        for call in (c for m in case.completion for c in m["tool_calls"] or []):
            content, stored = box.call(call).message["content"], results[call["id"]]
            assert content.startswith("Error: ") if stored.startswith("Error: ") else content == stored


@pytest.mark.parametrize("calls, shaping", [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.2), (7, 0.2)])
def test_tool_shaping_is_capped_at_max_calls(calls, shaping):
    score = VERIFIER.score(_task(), [*_calls(calls), assistant("<answer>56088</answer>")])
    assert score.components["tool_calls"] == pytest.approx(shaping)
    assert score.reward == pytest.approx(1.0 + shaping) and score.reward <= VERIFIER.reward_range[1]


def test_failed_calls_and_other_tools_earn_nothing():
    failed = _calls(3, content="Error: ValueError: division by zero")
    score = VERIFIER.score(_task(), [*failed, assistant("<answer>1</answer>")])
    assert score.reward == 0.0 and score.components == {"answer_found": 1.0, "correct": 0.0, "tool_used": 0.0,
                                                   "tool_calls": 0.0}
    mixed = [*failed, *_calls(1), assistant("<answer>56088</answer>")]
    assert VERIFIER.score(_task(), mixed).components["tool_calls"] == pytest.approx(0.1)
    other = _calls(2, tool="python")  # only the offered (shaped) tool earns shaping
    assert VERIFIER.score(_task(), [*other, assistant("<answer>56088</answer>")]).components["tool_calls"] == 0.0


@pytest.mark.parametrize("reply, expected", [
    ("<answer>56088</answer>", 1.0), ("<answer>56,088</answer>", 1.0), ("<answer>$56088.</answer>", 1.0),
    ("It is 56088", 1.0), ("\\boxed{56088}", 1.0), ("<answer>56088.0</answer>", 1.0),
    ("<answer>56088 or 56089</answer>", 0.0), ("<answer>5.6088e4</answer>", 0.0), ("<answer>56089</answer>", 0.0),
    ("I need a calculator.", 0.0), ("", 0.0),
])
def test_answer_parsing(reply, expected):
    assert cv.correct(_task(), [assistant(reply)]) == expected


def test_big_answers_are_compared_exactly():
    big = str(99 ** 9)  # 913517247483640899: floats cannot tell it from its neighbour
    assert float(big) == float(int(big) + 1)
    assert cv.correct(_task(big), [assistant(f"<answer>{big}</answer>")]) == 1.0
    assert cv.correct(_task(big), [assistant(f"<answer>{int(big) + 1}</answer>")]) == 0.0
