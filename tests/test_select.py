"""Selections of stored rollouts (hubgym.score.select): each rule keeps and drops what it says, every row read is
counted once under one reason, a seeded sweep of rule combinations keeps exactly the rows a direct reading of the
rules keeps, re-scoring replaces rewards before the rules see them, and a selection that keeps nothing says which.
No model runs: the rows are scored arithmetic rollouts written by tests/helpers/scored_runs.py."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from hubgym.errors import SelectionError
from hubgym.hub.rollouts import iter_rollouts, push_rollouts
from hubgym.score.choice import VerifierChoice
from hubgym.score.select import RULES, Selection, plan_selection
from hubgym.verifiers import arithmetic as arithmetic_verifier

from helpers.scored_runs import make_run

N = 4


def right(group: int, sample: int) -> bool:
    """Group 0: all right; group 1: all wrong; others: samples below group % N right (1..3 of 4)."""
    return {0: True, 1: False}.get(group, sample < group % N or (group % N == 0 and sample == 0))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("select") / "run", "r", groups=9, n=N, right=right)


@pytest.fixture(scope="module")
def rows(run) -> list[dict]:
    return list(iter_rollouts([run]))


def kept_by(run: Path, **rules) -> list[str]:
    return plan_selection([str(run)], Selection(**rules)).kept


def test_each_rule_keeps_what_it_says(run, rows):
    ids = [r["rollout_id"] for r in rows]
    assert kept_by(run) == ids  # no rule: every usable row, in source order
    assert kept_by(run, min_reward=1.0) == [r["rollout_id"] for r in rows if r["reward"] == 1.0]
    varied = {g for g in {r["group"] for r in rows} if len({r["reward"] for r in rows if r["group"] == g}) > 1}
    assert kept_by(run, varied_groups=True) == [r["rollout_id"] for r in rows if r["group"] in varied]
    best = kept_by(run, best_of_group=1)  # per group: the right sample with the lowest index, else sample 0
    assert best == [f"{g}-{min([r['sample'] for r in rows if r['group'] == g and r['reward'] == 1], default=0)}"
                    for g in dict.fromkeys(r["group"] for r in rows)]
    assert kept_by(run, limit=5) == ids[:5]
    assert kept_by(run, models=["m"]) == kept_by(run, models=["*"]) == ids
    assert kept_by(run, envs=["arithmetic"]) == kept_by(run, envs=["arithmetic:easy"]) == ids  # easy's tasks
    # Every sample of a group answers with the same token ids here, so duplicates are the group's other rows.
    assert kept_by(run, dedupe=True) == [r["rollout_id"] for r in rows if r["sample"] == 0]


def test_every_row_read_is_counted_once_under_the_first_rule_it_breaks(run, rows):
    plan = plan_selection([str(run)], Selection(min_reward=1.0, best_of_group=2, limit=4))
    counts = plan.counts
    assert counts["read"] == len(rows) == counts["kept"] + sum(counts[f"dropped/{r}"] for r in RULES)
    assert counts["kept"] == 4 and counts["dropped/limit"] > 0
    assert counts["dropped/best_of_group"] == 9 * (N - 2)  # before min_reward: group rules come first
    assert plan.metrics()["offline/select/kept"] == 4.0
    table = " ".join(str(cell) for column in plan.table().columns for cell in column._cells)
    assert "dropped: best_of_group" in table and "dropped: limit" in table


@pytest.mark.slow
def test_random_rule_combinations_keep_exactly_the_rows_the_rules_describe(run, rows):
    """A seeded sweep of selections, each checked against the rules read directly off the rows."""
    rng = random.Random(0)
    for _ in range(60):
        rules = {"min_reward": rng.choice([None, 0.5, 1.0]), "varied_groups": rng.random() < 0.5,
                 "best_of_group": rng.choice([None, 1, 2, 3]), "limit": rng.choice([0, 0, 3, 7]),
                 "dedupe": rng.random() < 0.3, "policy_versions": rng.choice([None, (0, 0), (1, 2)])}
        plan = plan_selection([str(run)], Selection(**rules))
        assert plan.kept == expected(rows, **rules), rules
        assert plan.counts["read"] == plan.counts["kept"] + sum(plan.counts[f"dropped/{r}"] for r in RULES)


def expected(rows, *, min_reward, varied_groups, best_of_group, limit, dedupe, policy_versions) -> list[str]:
    if policy_versions is not None and not policy_versions[0] <= 0 <= policy_versions[1]:
        return []
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    out, seen = [], set()
    for row in rows:
        mine = groups[row["group"]]
        if varied_groups and len({r["reward"] for r in mine}) == 1:
            continue
        ranked = sorted(mine, key=lambda r: (-r["reward"], r["sample"]))
        if best_of_group is not None and row not in ranked[:best_of_group]:
            continue
        if min_reward is not None and row["reward"] < min_reward:
            continue
        key = (row["task_id"], tuple(row["completion_ids"]))
        if dedupe and key in seen:
            continue
        if limit and len(out) >= limit:
            continue
        seen.add(key)
        out.append(row["rollout_id"])
    return out


def test_a_selection_that_keeps_nothing_is_one_line_naming_it(run, rows):
    plan = plan_selection([str(run)], Selection(min_reward=2.0, models=["m"]))
    message = (f"the selection (min_reward=2, models=[m]) keeps none of the {len(rows)} rows of {run} (dropped: "
               f"{len(rows)} by min_reward); loosen it, or give sources that hold such rows")
    with pytest.raises(SelectionError, match=f"^{re.escape(message)}$"):
        plan.check_not_empty()
    wrong_config = plan_selection([str(run)], Selection(envs=["arithmetic:hard"]))  # 3 operands: none of easy's
    assert wrong_config.counts["dropped/env"] == len(rows) and not wrong_config.kept


def test_rescoring_replaces_rewards_before_the_rules_and_counts_the_changes(run, rows, tmp_path):
    """A verifier that now gives half a point for the <answer> tag: every wrong row (all tagged) changes."""
    source = Path(arithmetic_verifier.__file__).read_text()
    changed = tmp_path / "arith_v2.py"
    changed.write_text(source.replace("formatted: 0.0}", "formatted: 0.5}"))
    plan = plan_selection([str(run)], Selection(min_reward=1.0), choice=VerifierChoice(str(changed)))
    assert plan.changed == len(rows)  # every reward moves by 0.5
    assert plan.kept == [r["rollout_id"] for r in rows if r["reward"] == 1.0]  # 1.5 >= 1; 0.5 < 1
    stored = dict(rows[0])
    assert plan.row(stored)["reward"] == rows[0]["reward"] + 0.5
    assert {m["name"] for m in stored["metrics"]} >= {"reward/correct", "success"}
    same = plan_selection([str(run)], Selection(success=True), choice=VerifierChoice())  # today's verifier
    assert same.changed == 0 and same.kept == [r["rollout_id"] for r in rows if r["reward"] == 1.0]


def test_a_hub_rollout_repo_pinned_to_a_revision_is_planned_like_its_folder(run, rows, tmp_path):
    pushed = push_rollouts(run, "org/rollouts", hub=tmp_path / "hub", name="first")
    ref = f"org/rollouts@{pushed.revision}:first"
    plan = plan_selection([ref], Selection(best_of_group=1), hub=tmp_path / "hub")
    assert plan.kept == kept_by(run, best_of_group=1) and plan.sources == [ref]
