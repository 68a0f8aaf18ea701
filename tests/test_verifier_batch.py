"""Batch rewards (`BATCH_REWARDS`, `Verifier.score_batch`): a batch gives exactly what its rows give one at a time
(components, totals, errors), a failing batch reward fails only the rows that make it fail, and bad declarations
are load errors naming the field."""

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubgym.errors import VerifierLoadError
from hubgym.schemas import assistant, interaction, tool_result, user
from hubgym.verifiers import load_verifier

HYBRID = """
    import math

    def parse_answer(task, completion):
        return completion[-1]["content"].strip() or None if completion else None

    def exact(task, completion):
        return float(bool(completion) and completion[-1]["content"] == task["info"].get("answer"))

    def length(tasks, completions):
        out = []
        for completion in completions:
            text = completion[-1]["content"] if completion else ""
            if text == "boom":
                raise ValueError("a row says boom")
            out.append({"nan": math.nan, "int": 1, "text": "0.5", "bool": True}.get(text, min(len(text), 10) / 10))
        return out

    def keyed(tasks, completions):  # a KeyError for rows whose info has no answer
        return [float(task["info"]["answer"] in (c[-1]["content"] if c else "")) for task, c in zip(tasks, completions)]

    REWARDS = {exact: 1.0}
    BATCH_REWARDS = {length: 0.1, keyed: 0.2}
    REWARD_RANGE = (0.0, 2.0)
"""
SHAPED = interaction("tool_use", max_turns=3, tools=["calculator"],
                     tool_rewards=[{"tool": "calculator", "reward": 0.1, "max_calls": 2}])
SINGLE = interaction("single_turn")
REPLIES = ["7", "  7 ", "boom", "nan", "int", "text", "bool", "", "a reply of some length", "<answer>7</answer>"]


def _load(tmp_path, source, name="verifier.py"):
    (tmp_path / name).write_text(textwrap.dedent(source))
    return load_verifier(name, relative_to=tmp_path, env="t")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return _load(tmp_path_factory.mktemp("hybrid"), HYBRID)


@pytest.fixture(scope="module")
def mdp(tmp_path_factory):
    return _load(tmp_path_factory.mktemp("mdp"), MDP)


@st.composite
def rows(draw):
    """(task, completion): a reply from REPLIES (some make a reward fail), an info with or without the answer,
    some rows with tool shaping and tool results."""
    reply = draw(st.sampled_from(REPLIES))
    info = {"answer": draw(st.sampled_from(["7", "8"]))} if draw(st.booleans()) else {}
    shaped = draw(st.booleans())
    task = {"id": f"t{draw(st.integers(0, 3))}", "env": "t", "prompt": [user("q")], "info": info,
            "interaction": SHAPED if shaped else SINGLE}
    calls = [tool_result("3" if draw(st.booleans()) else "Error: bad", f"c{i}", "calculator")
             for i in range(draw(st.integers(0, 3)) if shaped else 0)]
    return task, calls + [assistant(reply)]


@settings(max_examples=100, deadline=None)
@given(batch=st.lists(rows(), max_size=12))
def test_a_batch_scores_what_its_rows_score_alone(hybrid, batch):
    verifier = hybrid
    tasks, completions = [t for t, _ in batch], [c for _, c in batch]
    assert verifier.score_batch(tasks, completions) == [verifier.score(t, c) for t, c in batch]


MDP = """
    def reset(task):
        return {"count": 0}, "Say 'up'."

    def step(task, state, action):
        state = {"count": state["count"] + (action.strip() == "up")}
        done = state["count"] >= task["info"]["target"]
        return state, "stop" if done else f"count={state['count']}", 0.5 if done else 0.1, done

    def turns(tasks, completions):
        return [float(sum(m["role"] == "assistant" for m in c)) for c in completions]

    REWARDS = {}
    BATCH_REWARDS = {turns: 0.0}
    REWARD_RANGE = (0.0, 1.0)
"""


@settings(max_examples=60, deadline=None)
@given(batch=st.lists(st.tuples(st.lists(st.sampled_from(["up", "down", ""]), min_size=1, max_size=5),
                                st.integers(1, 3), st.booleans()), max_size=8))
def test_a_multi_turn_batch_with_cut_replies_scores_what_its_rows_score_alone(mdp, batch):
    verifier = mdp
    tasks = [{"id": "m", "env": "t", "prompt": [], "info": {"target": target},
              "interaction": interaction("multi_turn", max_turns=6)} for _, target, _ in batch]
    completions = [[assistant(a) for a in actions] for actions, _, _ in batch]
    cuts = [cut for _, _, cut in batch]
    alone = [verifier.score(t, c, cut=cut) for t, c, cut in zip(tasks, completions, cuts)]
    assert verifier.score_batch(tasks, completions, cuts) == alone
    assert all(s.components["turns"] == len(c) for s, c in zip(alone, completions))


def test_a_row_that_makes_a_batch_reward_raise_fails_alone_with_the_line_to_read(hybrid):
    verifier = hybrid
    task = {"id": "t", "env": "t", "prompt": [], "info": {"answer": "7"}, "interaction": SINGLE}
    scores = verifier.score_batch([task] * 4, [[assistant(r)] for r in ("7", "boom", "8", "<answer>7</answer>")])
    assert [s.reward is None for s in scores] == [False, True, False, False]
    assert scores[1].error == {"boundary": "verifier", "type": "ValueError",
                               "message": "a row says boom (at verifier.py:15 in length)"}
    assert scores[1].components == {"answer_found": 1.0, "exact": 0.0}  # what ran before the failure stays
    assert scores[0].reward == 1.0 + 0.1 * 0.1 + 0.2 and scores[2].components["exact"] == 0.0


@pytest.mark.parametrize("reply, value", [("nan", "nan"), ("text", "'0.5'"), ("bool", "True")])
def test_a_value_that_is_not_a_finite_number_fails_only_its_row(hybrid, reply, value):
    verifier = hybrid
    task = {"id": "t", "env": "t", "prompt": [], "info": {"answer": "7"}, "interaction": SINGLE}
    ok, bad = verifier.score_batch([task, task], [[assistant("7")], [assistant(reply)]])
    assert ok.error is None and bad.reward is None
    assert bad.error == {"boundary": "verifier", "type": "TypeError",
                         "message": f"reward function 'length' returned {value}; it must return a finite float"}


def test_an_int_is_a_reward_as_per_row_functions_take_it(hybrid):
    verifier = hybrid
    task = {"id": "t", "env": "t", "prompt": [], "info": {"answer": "7"}, "interaction": SINGLE}
    (score,) = verifier.score_batch([task], [[assistant("int")]])
    assert score.components["length"] == 1.0 and type(score.components["length"]) is float


@pytest.mark.parametrize("body, returned", [("return (x for x in [1.0, 1.0, 1.0])", "generator"),
                                            ("return 1.0", "float")])
def test_a_batch_reward_that_never_returns_a_list_is_every_rows_error(tmp_path, body, returned):
    verifier = _load(tmp_path, f"def odd(tasks, completions):\n    {body}\nBATCH_REWARDS = {{odd: 1.0}}\n")
    task = {"id": "t", "env": "t", "prompt": [], "info": {}, "interaction": SINGLE}
    scores = verifier.score_batch([task] * 3, [[assistant("x")]] * 3)
    assert [s.error for s in scores] == [{"boundary": "verifier", "type": "TypeError", "message": (
        f"batch reward function 'odd' returned {returned}; it must return a list of floats, one per row")}] * 3


def test_a_batch_reward_of_the_wrong_length_is_narrowed_to_the_batches_it_fits(tmp_path):
    """One value whatever the batch: wrong for 3 rows, so the batch is split until each part is one row, where one
    value is right; each row gets what it gets alone. Zero values is wrong even for one row: every row fails."""
    verifier = _load(tmp_path, "def one(tasks, completions):\n    return [1.0]\n"
                               "def none(tasks, completions):\n    return []\nBATCH_REWARDS = {one: 1.0}\n")
    task = {"id": "t", "env": "t", "prompt": [], "info": {}, "interaction": SINGLE}
    assert [s.reward for s in verifier.score_batch([task] * 3, [[assistant("x")]] * 3)] == [1.0] * 3
    verifier = _load(tmp_path, "def none(tasks, completions):\n    return []\nBATCH_REWARDS = {none: 1.0}\n",
                     "none.py")
    assert [s.error["message"] for s in verifier.score_batch([task] * 3, [[assistant("x")]] * 3)] == [
        "batch reward function 'none' returned 0 value(s) for 1 row(s); it must return one float per row, in the "
        "order of the rows"] * 3


def test_a_batch_reward_is_called_once_for_a_batch_that_scores(tmp_path):
    verifier = _load(tmp_path, """
        SEEN = []  # test instrument: the batch sizes the reward was called with
        def count(tasks, completions):
            SEEN.append(len(tasks))
            return [1.0] * len(tasks)
        BATCH_REWARDS = {count: 1.0}
    """)
    task = {"id": "t", "env": "t", "prompt": [], "info": {}, "interaction": SINGLE}
    verifier.score_batch([task] * 5, [[assistant("x")]] * 5)
    verifier.score(task, [assistant("x")])
    assert verifier.module.SEEN == [5, 1]


def test_batch_rewards_alone_make_a_verifier_and_count_toward_success(tmp_path):
    verifier = _load(tmp_path, """
        def half(tasks, completions):
            return [0.5] * len(tasks)
        def full(tasks, completions):
            return [1.0] * len(tasks)
        BATCH_REWARDS = {half: 1.0, full: 0.5}
        REWARD_RANGE = (0.0, 1.5)
    """)
    assert verifier.rewards == {} and verifier.weights == {"half": 1.0, "full": 0.5}
    assert verifier.success_threshold == 1.5
    score = verifier.score({"id": "t", "env": "t", "prompt": [], "info": {}, "interaction": SINGLE}, [assistant("x")])
    assert score.reward == 1.0 and score.components == {"half": 0.5, "full": 1.0}


def test_score_batch_refuses_lists_of_different_lengths(hybrid):
    verifier = hybrid
    with pytest.raises(ValueError, match="score_batch got 1 tasks, 2 completions and no cut flags"):
        verifier.score_batch([{}], [[], []])


@pytest.mark.parametrize("source, message", [
    ("BATCH_REWARDS = [1]\n", "BATCH_REWARDS of verifier '{module}' is a list, not a dict"),
    ("def r(tasks):\n    return []\nBATCH_REWARDS = {r: 1.0}\n", "BATCH_REWARDS key {fn} is not a function of "
                                                                    "(tasks, completions)"),
    ("def r(t, c):\n    return []\nBATCH_REWARDS = {r: True}\n", "BATCH_REWARDS weight for 'r' is True"),
    ("def steps(t, c):\n    return []\nBATCH_REWARDS = {steps: 1.0}\n",
     "BATCH_REWARDS has a function named 'steps', a component name hubgym reserves (answer_found, steps, tool_calls)"),
    ("def r(t, c):\n    return 1.0\nREWARDS = {r: 1.0}\ndef other(t, c):\n    return []\nother.__name__ = 'r'\n"
     "BATCH_REWARDS = {other: 1.0}\n",
     "BATCH_REWARDS has a function named 'r', and so does REWARDS: each reward's component name is its function's "
     "name"),
])
def test_bad_batch_rewards_are_load_errors_naming_env_and_field(tmp_path, source, message):
    with pytest.raises(VerifierLoadError) as err:
        _load(tmp_path, source)
    module = err.value.args[0].split("'")[1] if "{module}" in message else ""
    fn = str(err.value).split("key ")[1].split(" is not")[0] if "{fn}" in message else ""
    assert message.format(module=module, fn=fn) in str(err.value)
    assert (err.value.where.env, err.value.where.field) == ("t", "BATCH_REWARDS") and err.value.fix


def test_a_verifier_with_neither_table_says_how_to_declare_either(tmp_path):
    with pytest.raises(VerifierLoadError) as err:
        _load(tmp_path, "X = 1\n")
    assert "has no REWARDS dict" in str(err.value) and "BATCH_REWARDS = {batch_fn: weight" in err.value.fix
    with pytest.raises(VerifierLoadError) as err:
        _load(tmp_path, "BATCH_REWARDS = {}\n", "empty.py")
    assert "has no rewards: BATCH_REWARDS is empty and there is no REWARDS" in str(err.value)
    assert err.value.where.field == "BATCH_REWARDS"
