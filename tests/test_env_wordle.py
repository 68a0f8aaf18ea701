"""The `wordle` env: real builds, golden cases, Wordle marks, invalid and hard-mode guesses, replay."""

import json
import random

import pytest

import hubgym
from hubgym.envs import make_builder
from hubgym.builders.wordle import Wordle, secret_pool
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import interaction, make_task, user, validate_tasks
from hubgym.verifiers import wordle as wv

VERIFIER = Wordle.verifier()


def _task(secret="crane", hard=False, turns=6):
    return make_task("wordle", [user("play")], {"secret": secret, "max_turns": turns, "hard_mode": hard},
                     interaction("multi_turn", max_turns=turns))


def _config(name):
    return next(c for c in Wordle.BUILDER_CONFIGS if c.name == name)


@pytest.fixture(scope="module", params=Wordle.config_names())
def built(request):
    return request.param, hubgym.build_tasks("wordle", request.param)


@pytest.mark.slow
def test_builds_valid_rows_with_held_out_secrets(built):
    config, ds = built
    for split, rows in ds.items():
        validate_tasks(rows.data.table, Where("wordle", config, split))
        assert len(set(rows["id"])) == len(rows) == _config(config).sizes[split]
        assert {r["kind"] for r in rows["interaction"]} == {"multi_turn"}
        assert all(i["max_turns"] == 6 and i["hard_mode"] == (config == "hard") for i in rows["info"])
    train, test = ({i["secret"] for i in ds[s]["info"]} for s in ("train", "test"))
    assert len(train) == 500 and len(test) == 100 and not train & test and (train | test) <= wv.WORDS


def test_ids_are_deterministic():
    first, second = (hubgym.build_tasks("wordle", "hard")["test"] for _ in range(2))
    assert first["id"] == second["id"] and first["info"] == second["info"]


def test_oversized_split_names_field_and_fix():
    builder = make_builder("wordle", "default")
    with pytest.raises(EnvContractError) as err:
        list(builder.generate_tasks("test", size=len(secret_pool("test")) + 1, seed=0))
    assert err.value.where == Where("wordle", "default", "test", field="sizes") and "sizes['test'] <=" in err.value.fix


def test_golden_cases_score_as_declared():
    cases = Wordle.golden_cases()
    assert {c.reward for c in cases} >= set(VERIFIER.reward_range)
    for case in cases:
        episode = VERIFIER.run_episode(case.task, case.actions)
        assert VERIFIER.score(case.task, episode.completion()).reward == case.reward, case.name


def test_a_reply_cut_at_the_token_limit_is_no_guess_in_the_metrics():
    """The loop never steps a reply cut short: it is neither an invalid guess nor a win (v2), as in `steps`."""
    from hubgym.schemas import assistant

    task = {**Wordle.golden_cases()[0].task, "id": "t", "env": "wordle", "prompt": []}
    task["interaction"] = {"kind": "multi_turn", "max_turns": 6, "max_tokens": None, "tools": [], "tool_rewards": []}
    played = VERIFIER.run_episode(task, ["<guess>zzzzz</guess>"]).completion()
    for cut_reply, finish in (("<guess>cra", "length"), ("<guess>crane</guess>", "length")):
        completion = played + [assistant(cut_reply)]
        score = VERIFIER.score(task, completion, cut=True)
        assert score.components["invalid_guesses"] == 1.0 and score.components["solved"] == 0.0, cut_reply
        assert score.components["steps"] == 0.0
    answered = VERIFIER.run_episode(task, ["<guess>zzzzz</guess>", "<guess>crane</guess>"]).completion()
    assert VERIFIER.score(task, answered).components == {"solved": 1.0, "invalid_guesses": 1.0, "steps": 0.9375}


@pytest.mark.parametrize("secret, guess, expected", [
    ("crane", "error", "YGXXX"),  # one R is green; the secret has no second R
    ("those", "geese", "XXXGG"),  # the E is green at the end; no yellow for the other two
    ("abbey", "kebab", "XYGYY"),  # both Bs of the secret are used: one green, one yellow
    ("abbey", "babes", "YYGGX"),
    ("apple", "paper", "YYGYX"),  # two Ps in each: one green, one yellow
    ("speed", "erase", "YXXYY"),  # erase has two Es, speed two: both yellow
    ("crane", "crane", "GGGGG"),
])
def test_marks_handle_repeated_letters(secret, guess, expected):
    assert wv.marks(secret, guess) == expected


@pytest.mark.parametrize("action, message", [
    ("my guess is crane", "no guess found"),
    ("<guess>cranes</guess>", "'cranes' is not a 5-letter word"),
    ("<guess>cr4ne</guess>", "'cr4ne' is not a 5-letter word"),
    ("<guess>qwert</guess>", "'qwert' is not in the word list"),
])
def test_invalid_guess_is_explained_and_uses_a_turn(action, message):
    state, _ = wv.reset(_task())
    state, observation, reward, done = wv.step(_task(), state, action)
    assert message in observation and "used up a turn" in observation
    assert (state["turn"], state["guesses"], reward, done) == (1, [], 0.0, False)


@pytest.mark.parametrize("action", [
    "<guess> CRANE </guess>", "crane", "Crane.", "<GUESS>crane</GUESS>", "<guess>x</guess> then <guess>crane</guess>",
])
def test_guess_parsing_is_lenient_about_case_and_tags(action):
    assert wv.parse_guess(action) == "crane"


def test_hard_mode_requires_revealed_letters():
    task = _task("crane", hard=True)
    state = wv.step(task, wv.reset(task)[0], "<guess>react</guess>")[0]  # R Y, E Y, A G, C Y, T X
    assert state["marks"] == ["YYGYX"]
    _, observation, _, _ = wv.step(task, state, "<guess>beach</guess>")
    assert "hard mode: the guess must contain R" in observation
    _, observation, _, _ = wv.step(task, state, "<guess>cream</guess>")
    assert "hard mode: letter 3 must be A" in observation
    assert wv.step(task, state, "<guess>crane</guess>")[0]["solved_at"] == 2
    assert wv.step(_task("crane"), state, "<guess>beach</guess>")[0]["guesses"] == ["react", "beach"]


def test_episode_stops_at_done():
    episode = VERIFIER.run_episode(_task(), ["<guess>slate</guess>", "<guess>crane</guess>", "<guess>tulip</guess>"])
    assert [s.done for s in episode.steps] == [False, True] and episode.steps[-1].state["solved_at"] == 2
    final = episode.steps[-1].state
    assert wv.step(_task(), final, "<guess>tulip</guess>") == (final, "The game is over.", 0.0, True)
    cut = VERIFIER.run_episode(_task(turns=2), ["<guess>tulip</guess>"] * 5)
    assert len(cut.steps) == 2 and "the word was CRANE" in cut.steps[-1].observation


def _random_actions(rng, secret):
    near = [w for w in sorted(wv.WORDS) if len(set(w) & set(secret)) >= 3]
    pool = [secret, "zzzzz", "no idea", "<guess>toolong</guess>", *rng.sample(sorted(wv.WORDS), 20), *near[:20]]
    return [f"<guess>{rng.choice(pool)}</guess>" if rng.random() < 0.8 else rng.choice(pool) for _ in range(8)]


def test_random_play_is_deterministic_json_and_in_range():
    rng = random.Random(1234)
    lo, hi = VERIFIER.reward_range
    for _ in range(150):
        task = _task(rng.choice(sorted(wv.WORDS)), hard=rng.random() < 0.5)
        actions = _random_actions(rng, task["info"]["secret"])
        first, second = VERIFIER.run_episode(task, actions), VERIFIER.run_episode(task, actions)
        assert first == second
        assert all(json.loads(json.dumps(s.state)) == s.state and s.reward >= 0 for s in first.steps)
        total = VERIFIER.score(task, first.completion()).reward
        assert lo <= total <= hi and total == wv.progress(first.steps[-1].state) / wv.UNIT
