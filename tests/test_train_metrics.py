"""The metrics log: a resumed run keeps what its checkpoint had logged and nothing after; ranks other
than 0 write nothing; the before/after table shows a metric no row could give as '-'."""

from __future__ import annotations

import io
import json

from rich.console import Console

from hubgym.app.views import before_after_table
from hubgym.train.metrics import MetricsLog


def records(path) -> list[tuple[int, str]]:
    return [(r["step"], next(k for k in r if k != "step")) for r in map(json.loads, path.read_text().splitlines())]


def test_a_resumed_log_keeps_the_checkpointed_lines_and_drops_the_rest(tmp_path):
    log = MetricsLog(tmp_path)
    log.log(0, {"eval/e/reward": 0.1})
    for step in range(3):
        log.log(step, {"policy/loss": float(step)})
    at_checkpoint = log.lines  # steps 0 and 1 trained, then a checkpoint; step 2 was logged before the kill
    assert at_checkpoint == 4
    log.log(3, {"policy/loss": 3.0})

    resumed = MetricsLog(tmp_path, keep_lines=at_checkpoint - 1)  # the checkpoint was taken after step 1
    assert records(resumed.path) == [(0, "eval/e/reward"), (0, "policy/loss"), (1, "policy/loss")]
    assert resumed.logged(0, "eval/") == {"eval/e/reward": 0.1}  # the resumed run's "before" evaluation
    resumed.log(2, {"policy/loss": 2.5})
    assert [s for s, _ in records(resumed.path)] == [0, 0, 1, 2] and resumed.lines == 4
    assert resumed.close() is not None and (tmp_path / "metrics.png").stat().st_size > 0

    assert MetricsLog(tmp_path, keep_lines=None).lines == 4  # a checkpoint from before the count: keep all
    assert MetricsLog(tmp_path).lines == 0 and resumed.path.read_text() == ""  # a fresh run starts a new file


def test_only_an_enabled_log_writes(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "policy/loss": 1.0}\n')
    other_rank = MetricsLog(tmp_path, enabled=False, backends=["tensorboard"])
    other_rank.log(1, {"policy/loss": 0.5})
    assert other_rank.close() is None and other_rank.lines == 0
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0, "policy/loss": 1.0}\n'
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "metrics.png").exists()


def test_before_after_table_shows_missing_values_as_a_dash():
    table = before_after_table({"eval/e/reward": 0.25}, {"eval/e/reward": None, "eval/f/reward": 0.5})
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(table)
    text = console.export_text()
    assert "0.250" in text and "0.500" in text and text.count("-") >= 2
