"""`hubgym report`'s numbers and PNG, on hand-built rows in real Arrow shards, against hand-computed values.

The rows of env `arithmetic` are scored by the real arithmetic verifier, so its `answer_found` component
(from `parse_answer`) reaches the shards the way a rollout run stores it.
"""

from __future__ import annotations

import datetime as dt
from itertools import combinations
from math import isclose
from pathlib import Path

import pyarrow as pa
import pytest

from hubgym.envs import resolve_env
from hubgym.hub.rollout_card import env_stats
from hubgym.hub.rollout_stats import SUMMARY_COLUMNS, pass_at_k, scan_rollouts, summarize
from hubgym.rollout.report import plot_rewards, reward_figure
from hubgym.schemas import assistant, interaction, make_task, rollouts_to_table, user
from hubgym.schemas.rollouts import Rollout
from hubgym.train.evaluate import env_metrics

ARITHMETIC = resolve_env("arithmetic").verifier()
TASK = make_task("arithmetic", [user("What is 3 + 4?")], {"answer": "7"})
REPLIES = {"right": "<answer>7</answer>", "wrong": "<answer>8</answer>", "none": "I am not sure."}


def row(env: str, group: str, sample: int, *, reward: float | None, success: float = 0.0, reply: str = "",
        loop: dict[str, float] | None = None, components: dict[str, float] | None = None) -> Rollout:
    """A minimal valid rollout row; `reward=None` is a failed rollout (an engine error on the row)."""
    metrics = {**{f"reward/{k}": v for k, v in (components or {}).items()}, "success": success,
               "loop/tool_calls": 0.0, "loop/tool_errors": 0.0, "loop/parse_errors": 0.0,
               "loop/empty_responses": 0.0, **(loop or {})}
    return {
        "rollout_id": f"{group}-{sample}", "run_id": "run", "task_id": group, "env": env, "group": group,
        "sample": sample, "prompt": [user("q")], "completion": [assistant(reply)], "info": {},
        "interaction": interaction("single_turn"), "prompt_ids": [1, 2], "completion_ids": [3, 4, 5],
        "completion_mask": [1, 1, 1], "completion_logprobs": [-0.1] * 3, "tokens_consistent": True,
        "reward": reward, "metrics": [{"name": k, "value": float(v)} for k, v in metrics.items()],
        "finish_reason": "stop", "truncated": False, "num_turns": 1,
        "error": None if reward is not None else {"boundary": "engine", "type": "RequestError", "message": "refused"},
        "provenance": {"model": "m", "policy_version": 0, "sampling": "{}", "env_repo": None, "env_revision": None,
                       "verifier_module": "v", "verifier_sha256": "0" * 64, "engine": "vllm", "engine_version": "0",
                       "chat_template_sha256": None},
        "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0},
        "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    }


def scored(group: str, sample: int, kind: str, **loop: float) -> Rollout:
    """An arithmetic row scored by the real verifier, laid out as the rollout writer lays it out."""
    score = ARITHMETIC.score(TASK, [assistant(REPLIES[kind])])
    return row("arithmetic", group, sample, reward=score.reward, success=float(ARITHMETIC.succeeded(score)),
               reply=REPLIES[kind], components=score.components, loop={f"loop/{k}": v for k, v in loop.items()})


def write(path: Path, rows: list[Rollout]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = rollouts_to_table(rows)
    with pa.ipc.new_file(str(path), table.schema) as out:
        out.write_table(table)
    return path


def arithmetic_rows() -> list[Rollout]:
    """Three groups of 4: rewards 1,0,0,0 | 1,1,0,(failed) | 0,0,0,0; 5 scored replies without an answer."""
    return [scored("g1", 0, "right"), scored("g1", 1, "wrong", parse_errors=2), scored("g1", 2, "none"),
         scored("g1", 3, "none"),
         scored("g2", 0, "right"), scored("g2", 1, "right", parse_errors=1), scored("g2", 2, "wrong"),
         row("arithmetic", "g2", 3, reward=None, reply="", components={"answer_found": 0.0}),
         scored("g3", 0, "none"), scored("g3", 1, "none"), scored("g3", 2, "none"), scored("g3", 3, "wrong")]


@pytest.fixture
def shards(tmp_path) -> Path:
    """arithmetic: three groups of 4, one failed row; flat: every reward equal; mixed_n: groups of 2 and 4."""
    a = arithmetic_rows()
    flat = [row("flat", f"f{g}", i, reward=1.0, success=1.0, components={"correct": 1.0}) for g in range(2)
            for i in range(2)]
    mixed = ([row("mixed_n", "m1", i, reward=float(i == 0), success=float(i == 0)) for i in range(4)]
             + [row("mixed_n", "m2", i, reward=0.0) for i in range(2)])
    write(tmp_path / "run" / "shards" / "w000of001-00000.arrow", a[:6])
    write(tmp_path / "run" / "shards" / "w000of001-00001.arrow", a[6:] + flat)
    write(tmp_path / "other" / "shards" / "w000of001-00000.arrow", mixed)
    return tmp_path


def test_summary_of_hand_built_rows(shards):
    table = summarize(scan_rollouts([shards / "run", shards / "other"]))
    assert table.columns == SUMMARY_COLUMNS
    got = {r["env"]: r for r in table.iter_rows(named=True)}

    a = got["arithmetic"]  # 12 rows, 11 scored: rewards 1,0,0,0 | 1,1,0,(failed) | 0,0,0,0
    assert (a["rollouts"], a["groups"], a["n"], a["k"]) == (12, 3, 4, 3)  # k: the smallest group of scored rows
    assert isclose(a["errors"], 1 / 12) and isclose(a["mean_reward"], 3 / 11)
    assert isclose(a["pass@1"], 3 / 11)  # over the same 11 rows as mean_reward, not 3/12
    # pass@3 per group: 1 - C(3,3)/C(4,3) = 0.75; 1 - C(1,3)/C(3,3) = 1; 0
    assert isclose(a["pass@k"], (0.75 + 1 + 0) / 3)
    assert isclose(a["no_answer"], 5 / 11)  # "none" replies among the scored rows: 2 + 0 + 3
    assert isclose(a["tool_parse_failures"], 2 / 12) and a["tokens"] == 36

    f = got["flat"]  # every reward 1.0; no parse_answer: no_answer is empty, not 0
    assert (f["rollouts"], f["groups"], f["n"], f["k"], f["errors"]) == (4, 2, 2, 2, 0.0)
    assert (f["mean_reward"], f["pass@1"], f["pass@k"], f["no_answer"]) == (1.0, 1.0, 1.0, None)

    m = got["mixed_n"]  # groups of 4 (one success) and 2 (none): pass@2 = (1 - C(3,2)/C(4,2) + 0) / 2
    assert (m["n"], m["k"]) == (4, 2) and isclose(m["pass@k"], 0.25) and isclose(m["pass@1"], 1 / 6)


@pytest.mark.parametrize("k, expected", [(1, (0.25 + 2 / 3 + 0) / 3), (2, (0.5 + 1 + 0) / 3), (10, 1.75 / 3)])
def test_pass_at_k_with_k_named_is_capped_at_the_smallest_group(shards, k, expected):
    table = summarize(scan_rollouts([shards / "run"]), k=k).filter(env="arithmetic")
    assert table["k"].item() == min(k, 3) and isclose(table["pass@k"].item(), expected)
    assert isclose(table["pass@1"].item(), 3 / 11)  # pass@1 is the row share whatever k is


def test_pass_at_k_is_the_share_of_k_subsets_holding_a_success():
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(combinations([1] * c + [0] * (n - c), k))
                assert isclose(pass_at_k(n, c, k), sum(any(s) for s in subsets) / len(subsets), abs_tol=1e-12)


def test_k_below_one_is_refused(shards):
    with pytest.raises(ValueError, match="pass@k needs k >= 1, got k=0"):
        summarize(scan_rollouts([shards / "run"]), k=0)


def test_all_failed_env_has_no_reward_metrics(tmp_path):
    write(tmp_path / "r.arrow", [row("broken", "b1", i, reward=None) for i in range(3)])
    r = summarize(scan_rollouts([tmp_path / "r.arrow"])).row(0, named=True)
    assert (r["rollouts"], r["groups"], r["errors"]) == (3, 1, 1.0)
    assert (r["mean_reward"], r["pass@1"], r["k"], r["pass@k"], r["no_answer"]) == (None, None, None, None, None)


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


@pytest.mark.slow
def test_png_when_every_reward_is_equal_shows_counts_rates_and_components(tmp_path):
    rows = [row("flat", f"f{g}", i, reward=0.0, components={"correct": 0.0, "formatted": 1.0}) for g in range(3)
            for i in range(4)]
    scan = scan_rollouts([write(tmp_path / "flat.arrow", rows)])
    counts, rates, components = reward_figure(scan).axes

    assert _texts(counts) == ["12"]  # one reward, earned by all 12 rows
    assert [t.get_text() for t in counts.get_xticklabels()] == ["flat\n12 rows, 3 groups\n0 errors"]
    assert _texts(rates) == ["0.00", "0.00", "-", "0.00", "0.00"]  # pass@1, pass@4, no_answer, errors, truncated
    assert [t.get_text() for t in rates.get_legend().get_texts()][:2] == ["pass@1", "pass@4"]
    assert _texts(components) == ["correct 0.00", "formatted 1.00"]
    assert plot_rewards(scan, tmp_path / "flat.png").stat().st_size > 10_000


@pytest.mark.slow
def test_png_of_varied_rewards_over_several_envs(shards):
    scan = scan_rollouts([shards / "run", shards / "other"])
    counts, rates, components = reward_figure(scan).axes

    assert _texts(counts) == ["8", "3", "4", "5", "1"]  # arithmetic 0.0 x8, 1.0 x3; flat 1.0 x4; mixed_n 0.0 x5, 1.0 x1
    assert "arithmetic\n12 rows, 3 groups\n1 errors" in [t.get_text() for t in counts.get_xticklabels()]
    assert [t.get_text() for t in rates.get_legend().get_texts()][1] == "pass@k (k per env)"  # k = 3, 2, 2
    assert "answer_found 0.55" in _texts(components) and "correct 0.27" in _texts(components)
    assert plot_rewards(scan, shards / "varied.png").stat().st_size > 10_000


def test_training_log_env_metrics_use_the_same_rows():
    flat = [row("flat", "f0", i, reward=1.0, success=1.0) for i in range(2)]
    got = env_metrics(arithmetic_rows() + flat)
    assert isclose(got["env/arithmetic/reward"], 3 / 11) and isclose(got["env/arithmetic/success"], 3 / 11)
    assert isclose(got["env/arithmetic/no_answer"], 5 / 11) and isclose(got["env/arithmetic/errors"], 1 / 12)
    assert isclose(got["env/arithmetic/tool_parse_failures"], 2 / 12)
    assert "env/flat/no_answer" not in got and not any(k.endswith("/parse_failures") for k in got)


def test_rollout_card_combines_workers_over_the_rows_each_rate_is_over(tmp_path):
    write(tmp_path / "a.arrow", arithmetic_rows()[4:8] + [row("broken", "b", i, reward=None) for i in range(2)])
    write(tmp_path / "b.arrow", arithmetic_rows()[8:])
    workers = {}
    for name in ("a", "b"):
        table = summarize(scan_rollouts([tmp_path / f"{name}.arrow"]))
        workers[name] = {r["env"]: {**r, "rewarded": round(r["rollouts"] * (1 - r["errors"]))}
                         for r in table.iter_rows(named=True)}
    stats = env_stats({"workers": workers})
    assert isclose(stats["arithmetic"]["success"], 2 / 7)  # 2 of the 7 rewarded rows, not (2/3 * 4 + 0) / 8
    assert stats["arithmetic"]["pass@k"] is None and stats["arithmetic"]["k"] is None  # k = 3 and k = 4 differ
    assert stats["broken"]["success"] is None and stats["broken"]["pass@k"] is None  # every row failed


@pytest.mark.slow
def test_hubgym_report_names_k_and_draws_the_png(shards):
    from typer.testing import CliRunner

    from hubgym.cli import app

    result = CliRunner().invoke(app, ["report", str(shards / "run"), "--k", "2"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    header, arithmetic, flat = [line.split() for line in result.output.splitlines()
                                if line.strip().startswith(("env ", "arithmetic ", "flat "))]
    assert header == SUMMARY_COLUMNS
    assert dict(zip(header, arithmetic))["k"] == "2" and dict(zip(header, arithmetic))["pass@k"] == "0.500"
    assert dict(zip(header, flat))["no_answer"] == "-"
    assert (shards / "run" / "rewards.png").stat().st_size > 10_000
    assert CliRunner().invoke(app, ["report", str(shards / "run"), "--k", "0"]).exit_code == 2  # usage error


def test_a_report_table_never_cuts_a_column_name_however_narrow_the_terminal():
    """Too wide for the terminal, the table turns (one line per column), and narrower still, stacks (one two-column
    table per env); every column name and env stays whole, never ended with an ellipsis."""
    import io

    import polars as pl
    from rich.console import Console

    from hubgym.app.views import frame_table

    frame = pl.DataFrame({"env": ["arithmetic", "calc_tools"], "mean_reward": [0.25, 0.5], "pass@1": [0.1, 0.2],
                          "no_answer": [0.05, 0.0], "mean_completion_tokens": [44.5, 80.0]})
    for width in (40, 60, 200):
        out = io.StringIO()
        Console(file=out, width=width).print(frame_table(frame, "run"))
        text = out.getvalue()
        assert "…" not in text and max(map(len, text.splitlines())) <= width
        assert all(name in text for name in [*frame.columns[1:], "arithmetic", "calc_tools"]), (width, text)
