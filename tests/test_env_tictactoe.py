"""The `tictactoe` env: real builds, golden cases, the scripted opponent, move parsing, forfeits, replay."""

import json
import random

import pytest

import hubgym
from hubgym.envs import make_builder
from hubgym.builders.tictactoe import TicTacToe, opening_pool
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import interaction, make_task, user, validate_tasks
from hubgym.verifiers import tictactoe as tv

VERIFIER = TicTacToe.verifier()
STRONG = {"opening": [], "seed": 0, "random_pct": 0, "max_invalid": 3}


def _task(opening=(), seed=0, random_pct=0, max_invalid=3):
    info = {"opening": list(opening), "seed": seed, "random_pct": random_pct, "max_invalid": max_invalid}
    return make_task("tictactoe", [user("play")], info, interaction("multi_turn", max_turns=9))


def _config(name):
    return next(c for c in TicTacToe.BUILDER_CONFIGS if c.name == name)


@pytest.mark.parametrize("config", TicTacToe.config_names())
def test_builds_valid_rows_with_held_out_openings(config):
    ds = hubgym.build_tasks("tictactoe", config)
    for split, rows in ds.items():
        validate_tasks(rows.data.table, Where("tictactoe", config, split))
        assert len(set(rows["id"])) == len(rows) == _config(config).sizes[split]
        assert all(i["random_pct"] == _config(config).random_pct for i in rows["info"])
        for info, spec in zip(rows["info"], rows["interaction"]):
            assert spec["kind"] == "multi_turn" and spec["max_turns"] == (10 - len(info["opening"])) // 2 + 2
    train, test = ({tuple(i["opening"]) for i in ds[s]["info"]} for s in ("train", "test"))
    assert len(train) == 300 and len(test) == 60 and not train & test
    assert {len(o) for o in train} == {0, 1, 2, 3}  # short openings are not swamped by 3-move ones


@pytest.mark.slow
def test_ids_are_deterministic():
    first, second = (hubgym.build_tasks("tictactoe", "easy")["train"] for _ in range(2))
    assert first["id"] == second["id"] and first["info"] == second["info"]


def test_oversized_split_names_field_and_fix():
    builder = make_builder("tictactoe", "default")
    with pytest.raises(EnvContractError) as err:
        list(builder.generate_tasks("test", size=111, seed=0))
    assert err.value.where == Where("tictactoe", "default", "test", field="sizes") and "<= 110" in err.value.fix


def test_every_opening_leaves_x_to_move_in_a_live_game():
    for split in ("train", "test"):
        for opening in (o for group in opening_pool(split).values() for o in group):
            state, observation = tv.reset(_task(opening))
            board = state["board"]  # O moved last: equal counts if X started, one more O if O started
            assert board.count("O") - board.count("X") == len(opening) % 2 and tv.outcome(board) == ""
    board = " X | 2 | 3\n---+---+---\n 4 | O | 6\n---+---+---\n 7 | 8 | O"
    assert tv.reset(_task([5, 1, 9]))[1] == f"{board}\nYou are X. Your move."


def test_golden_cases_score_as_declared():
    cases = TicTacToe.golden_cases()
    assert {c.reward for c in cases} >= set(VERIFIER.reward_range)
    for case in cases:
        episode = VERIFIER.run_episode(case.task, case.actions)
        assert VERIFIER.score(case.task, episode.completion()).reward == case.reward, case.name


@pytest.mark.parametrize("board, move", [
    ("XX.OO....", 5),  # O can win at 6: it wins rather than block X at 3
    ("XX..O....", 2),  # X threatens 1-2-3: O blocks at 3
    ("X.X.O...X", 1),  # two X threats (2 and 6): O blocks the first line found
    ("X........", 4),  # no threats: center
])
def test_opponent_wins_then_blocks_then_center(board, move):
    assert tv.opponent_move(STRONG, board) == move


def test_opponent_takes_the_win_in_step():
    task = _task([1, 5, 2])  # O started: O 1, X 5, O 2 -- O threatens 3
    state, _ = tv.reset(task)
    assert state["board"] == "OO..X...."
    state, observation, reward, done = tv.step(task, state, "<move>9</move>")
    assert state == {"board": "OOO.X...X", "invalid": 0, "result": "loss"} and (reward, done) == (0.0, True)
    assert observation.startswith("You played 9. O played 3.") and observation.endswith("O wins.")


def test_opponent_blocks_in_step():
    task = _task([1, 5])  # X 1, O 5
    state, _ = tv.reset(task)
    state = tv.step(task, state, "<move>2</move>")[0]  # X threatens 3: O must block there
    assert state["board"] == "XXO.O...." and state["result"] == ""


def test_easy_opponent_is_seeded_and_legal():
    board = "XX..O...."  # the strong reply is the block at 3
    replies = {tv.opponent_move({**STRONG, "seed": seed, "random_pct": 100}, board) for seed in range(40)}
    assert replies <= {2, 3, 5, 6, 7, 8} and len(replies) > 1
    info = {**STRONG, "seed": 3, "random_pct": 50}
    assert len({tv.opponent_move(info, board) for _ in range(5)}) == 1  # a pure function of task and board


@pytest.mark.parametrize("action, cell", [
    ("<move>5</move>", 4), ("<move> b2 </move>", 4), ("a1", 0), ("<move>C3</move>", 8), ("I'll take 7", 6),
    ("Not 3... <move>9</move>", 8), ("<move>10</move>", None), ("the center", None),
])
def test_moves_parse_from_numbers_and_coordinates(action, cell):
    assert tv.parse_move(action) == cell


def test_invalid_moves_are_explained_then_forfeit():
    task = _task([5], max_invalid=2)
    state, _ = tv.reset(task)
    state, observation, reward, done = tv.step(task, state, "<move>5</move>")
    assert observation.startswith("Invalid move: cell 5 is taken. 1 more invalid move forfeits the game.")
    assert (state["invalid"], state["board"], reward, done) == (1, "....O....", 0.0, False)
    state, observation, reward, done = tv.step(task, state, "pass")
    assert "no cell found" in observation and "you lose" in observation
    assert (state["result"], reward, done) == ("forfeit", 0.0, True)


def test_episode_stops_at_done():
    actions = ["<move>1</move>", "<move>6</move>", "<move>3</move>", "<move>9</move>", "<move>4</move>"]
    episode = VERIFIER.run_episode(_task(), actions)
    assert [s.done for s in episode.steps] == [False, False, False, True] and episode.steps[-1].reward == 1.0
    final = episode.steps[-1].state
    assert tv.step(_task(), final, "<move>4</move>") == (final, "The game is over.", 0.0, True)


def test_random_play_is_deterministic_json_and_in_range():
    rng = random.Random(99)
    lo, hi = VERIFIER.reward_range
    pool = [f"<move>{c}</move>" for c in range(1, 10)] + ["b2", "a3", "hmm", "<move>0</move>"]
    for _ in range(300):
        task = _task(rng.sample(range(1, 10), rng.choice([0, 1, 2, 3])), rng.randrange(1000), rng.choice([0, 50, 100]))
        actions = [rng.choice(pool) for _ in range(15)]
        first, second = VERIFIER.run_episode(task, actions), VERIFIER.run_episode(task, actions)
        assert first == second and first.done
        assert all(json.loads(json.dumps(s.state)) == s.state for s in first.steps)
        assert all(s.reward == 0.0 for s in first.steps[:-1])
        total = VERIFIER.score(task, first.completion()).reward
        assert lo <= total <= hi and total == tv.OUTCOME_REWARD[first.steps[-1].state["result"]]
