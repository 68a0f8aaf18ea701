"""`hubgym eval`: a model's held-out reward with its interval, from the rollouts it wrote."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.hub.rollout_reader import iter_rollouts

pytestmark = pytest.mark.slow


def test_eval_samples_the_held_out_split_and_prints_reward_with_its_interval(tiny_model, tmp_path):
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", "arithmetic:tiny", "--model", str(tiny_model), "--limit", "5", "--n",
                                      "3", "--max-tokens", "8", "--out", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = list(iter_rollouts(out / "step-000000"))
    assert len(rows) == 15 and len({r["task_id"] for r in rows}) == 5
    mean = sum(r["reward"] for r in rows) / len(rows)
    line = next(line for line in result.output.splitlines() if line.strip().startswith("arithmetic"))
    assert line.split()[1] == f"{mean:.3f}"  # the mean of what it wrote
    low, high = float(line.split()[2]), float(line.split()[4])
    assert low <= mean <= high
