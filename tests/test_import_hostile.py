"""`hubgym import verifiers` is as strict as hubgym's readers: every hostile traces file (deep nesting, numbers past
float range, times out of range, every field of another JSON type, token ids as strings or past the vocabulary,
non-finite logprobs, an env name that is a path, sizes past the bounds, empty files, FIFOs) is one `error:` line
naming the file and line, no traceback, and leaves nothing behind: a valid import into the same folder then
succeeds. The traces are written by hand (helpers/vf_traces.py); the tiny model re-derives tokens and logprobs."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.envs.build import build_tasks
from hubgym.hub.rollout_reader import iter_rollouts
from hubgym.integrations.verifiers_traces import MAX_LINE_BYTES, MAX_TRACE_CHARS

from helpers.vf_traces import episode, trace, write_traces

runner = CliRunner()


@pytest.fixture(scope="module")
def task() -> dict[str, Any]:
    return build_tasks("arithmetic", "easy")["test"][0]


def imported(results: Path, out: Path, *extra: str):
    return runner.invoke(app, ["import", "verifiers", str(results), "--out", str(out), "--model", "tiny", *extra],
                         env={"COLUMNS": "400"})


def at(path: tuple, value: Any) -> Callable[[dict], None]:
    """A change setting the field at `path` of a trace (keys and indices) to `value`."""
    def change(t: dict) -> None:
        node = t
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def task_field(name: str, value: Any) -> Callable[[dict], None]:
    """A change to the hubgym task row the trace carries (task.data.hubgym_task, a JSON string)."""
    def change(t: dict) -> None:
        task = json.loads(t["task"]["data"]["hubgym_task"])
        task[name] = value(task[name]) if callable(value) else value
        t["task"]["data"]["hubgym_task"] = json.dumps(task)
    return change


def tokens(**node) -> Callable[[dict], None]:
    """The trace's reply node given a token record (and its prompt node the ids [1, 2, 3])."""
    def change(t: dict) -> None:
        t["nodes"][0]["token_ids"] = [1, 2, 3]
        t["nodes"][-1].update({"token_ids": [4, 5], "mask": [True, True], "logprobs": [-0.5, -0.5], **node})
    return change


def nested(levels: int) -> dict:
    value: Any = 1
    for _ in range(levels):
        value = {"x": value}
    return value


TRACE_CHANGES: dict[str, tuple[Callable[[dict], None], str]] = {
    "rewards a list": (at(("rewards",), [1.0]), "rewards is an array, not an object"),
    "a reward score a string": (at(("rewards", "correct", "score"), "1"), "score is a string, not a number"),
    "a reward weight a boolean": (at(("rewards", "correct", "weight"), True), "weight is a boolean, not a number"),
    "rewards adding up past float range": (at(("rewards",), {"a": {"score": 1e308, "weight": 10.0}}),
                                           "not a finite number"),
    "errors a string": (at(("errors",), "boom"), "errors is a string, not an array"),
    "an error not an object": (at(("errors",), ["boom"]), "errors[0] is a string, not an object"),
    "calls an object": (at(("calls",), {"a": 1}), "calls is an object, not an array"),
    "a finish reason a number": (at(("calls", 0, "finish_reason"), 7), "finish_reason is an integer, not a string"),
    "info a list": (at(("info",), [1]), "info is an array, not an object"),
    "verifiers a string": (at(("verifiers",), "0.4"), "verifiers is a string, not an object"),
    "ok a string": (at(("ok",), "yes"), "ok is a string, not a boolean"),
    "timing missing": (lambda t: t.pop("timing"), "has no field 'timing'"),
    "timing.start a string": (at(("timing", "start"), "2026"), "start is a string, not a number"),
    "timing.start past year 9999": (at(("timing", "start"), 1e20), "not a time between 1970 and the year 9999"),
    "timing.start negative": (at(("timing", "start"), -5.0), "not a time between 1970"),
    "an empty node list": (at(("nodes",), []), "nodes is empty"),
    "nodes an object": (at(("nodes",), {}), "nodes is an object, not an array"),
    "a parent that is a string": (at(("nodes", 1, "parent"), "0"), "parent '0' is not an earlier node"),
    "a parent cycle": (at(("nodes", 0, "parent"), 1), "is not an earlier node"),
    "sampled a string": (at(("nodes", 1, "sampled"), "yes"), "sampled is a string, not a boolean"),
    "a message role unknown": (at(("nodes", 1, "message", "role"), "wizard"), "a message has role 'wizard'"),
    "a message content a number": (at(("nodes", 1, "message", "content"), 5), "content is an integer, not a string"),
    "a tool_call_id an object": (at(("nodes", 1, "message", "tool_call_id"), {"a": 1}),
                                 "tool_call_id is an object, not a string"),
    "a tool call id a number": (at(("nodes", 1, "message", "tool_calls"), [{"id": 5, "name": "f", "arguments": "{}"}]),
                                "tool_calls[0].id is an integer, not a string"),
    "token ids a string": (tokens(token_ids="45"), "token_ids is a string, not an array"),
    "token ids as strings": (tokens(token_ids=["4", "5"]), "token_ids[0] is a string, not an integer"),
    "a token id 10^30": (tokens(token_ids=[10**30, 5]), "breaks rule token-ids-in-range"),
    "a negative token id": (tokens(token_ids=[-5, 5]), "breaks rule token-ids-in-range"),
    "a token id past the vocabulary": (tokens(token_ids=[4, 100_000]), "breaks rule token-ids-in-vocabulary"),
    "a mask an integer": (tokens(mask=1), "mask is an integer, not an array"),
    "a mask value 2": (tokens(mask=[2, 1]), "mask holds a value other than true/false"),
    "a NaN logprob": (tokens(logprobs=[float("nan"), -0.5]), "logprobs is nan, not a finite number"),
    "a positive logprob": (tokens(logprobs=[3.0, -0.5]), "breaks rule logprobs-finite"),
    "an env named like a path": (task_field("env", "../../../etc/x"), "breaks rule env-name"),
    "an interaction kind that is a path": (task_field("interaction", lambda i: {**i, "kind": "../../evil"}),
                                           "breaks rule interaction-kind"),
    "info nested 100 deep": (task_field("info", nested(100)), "info"),
    "hubgym_task not JSON": (at(("task", "data", "hubgym_task"), "{"), "hubgym_task is not JSON"),
    "hubgym_task nested 100,000 deep": (at(("task", "data", "hubgym_task"), "[" * 100_000 + "]" * 100_000),
                                        "hubgym_task is not JSON"),
    "a trace's text past the bound": (at(("nodes", 1, "message", "content"), "x" * (MAX_TRACE_CHARS + 1)),
                                      "characters of message text"),
}

LINES: dict[str, tuple[Callable[[str], bytes], str]] = {
    "nested 100,000 deep": (lambda good: ("[" * 100_000 + "]" * 100_000).encode(), "is not JSON hubgym reads"),
    "a number past float range": (lambda good: good.replace('"score": 1.0', '"score": 1e400').encode(),
                                  "score is inf, not a finite number"),
    "a number of 5,000 digits": (lambda good: good.replace('"score": 1.0', '"score": ' + "9" * 5000).encode(),
                                 "is not JSON hubgym reads"),
    "not UTF-8": (lambda good: good.encode().replace(b"arithmetic", b"arith\xffmetic", 1), "is not JSON hubgym reads"),
    "traces an object": (lambda good: b'{"traces": {}}', "traces is an object, not an array"),
    "a trace a number": (lambda good: b'{"traces": [5]}', "traces[0] is an integer, not an object"),
    "a line past the bound": (lambda good: b'{"pad": "' + b"x" * MAX_LINE_BYTES + b'"}',
                              "an episode line holds at most"),
}


def assert_one_clean_line(done, says: str, out: Path) -> None:
    lines = done.output.strip().splitlines()
    assert done.exit_code == 1 and "Traceback" not in done.output, done.output[-2000:]
    assert len([line for line in lines if line.startswith("error: ")]) == 1, done.output[-2000:]
    assert says in done.output and "traces.jsonl" in done.output, done.output[-2000:]
    assert not out.exists()  # nothing left behind: no shard, manifest, lock or claim


def assert_a_valid_import_goes_in(task, tmp_path: Path, out: Path) -> None:
    good = write_traces(tmp_path / "good", [episode(trace(task), trace(task, "<answer>1</answer>", 0.0))])
    done = imported(good, out)
    assert done.exit_code == 0, done.output
    assert len(list(iter_rollouts(out))) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TRACE_CHANGES))
def test_a_hostile_trace_is_one_line_and_leaves_nothing_behind(task, tmp_path, name):
    change, says = TRACE_CHANGES[name]
    bad = copy.deepcopy(trace(task))
    change(bad)
    results = write_traces(tmp_path / "bad", [episode(trace(task)), episode(bad)])
    out = tmp_path / "out"
    assert_one_clean_line(imported(results, out), says, out)
    assert "traces.jsonl:2 traces[0]" in imported(results, out).output  # the line and the trace are named
    assert_a_valid_import_goes_in(task, tmp_path, out)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LINES))
def test_a_hostile_line_is_one_line_and_leaves_nothing_behind(task, tmp_path, name):
    make, says = LINES[name]
    good = json.dumps(episode(trace(task)))
    results = write_traces(tmp_path / "bad", [good, make(good)])
    out = tmp_path / "out"
    assert_one_clean_line(imported(results, out), says, out)
    assert_a_valid_import_goes_in(task, tmp_path, out)


@pytest.mark.parametrize("name, make, says", [
    ("an empty file", lambda folder: (folder / "traces.jsonl").write_bytes(b""), "holds no traces"),
    ("blank lines only", lambda folder: (folder / "traces.jsonl").write_bytes(b"\n \n"), "holds no traces"),
    ("a FIFO", lambda folder: os.mkfifo(folder / "traces.jsonl"), "holds no traces.jsonl"),
    ("a folder", lambda folder: (folder / "traces.jsonl").mkdir(), "holds no traces.jsonl"),
])
def test_files_that_hold_no_traces_are_one_line(tmp_path, name, make, says):
    folder = tmp_path / "results"
    folder.mkdir()
    make(folder)
    out = tmp_path / "out"
    done = imported(folder, out)
    assert done.exit_code == 1 and done.output.strip().startswith("error: ") and says in done.output, done.output
    assert "Traceback" not in done.output and not out.exists()


def test_a_character_device_is_not_read(tmp_path):
    done = imported(Path("/dev/zero"), tmp_path / "out")  # /dev/zero would be read forever
    assert done.exit_code == 1 and "holds no traces.jsonl" in done.output and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_hostile_cases_cover_every_field_the_import_reads(task):
    """Every top-level field of a trace and of its reply node is changed by some case (a new field the import starts
    to read needs a hostile case too)."""
    touched: set[str] = set()
    for change, _ in TRACE_CHANGES.values():
        before, after = trace(task), copy.deepcopy(trace(task))
        change(after)
        touched |= {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        if isinstance(after["nodes"], list):
            for old, new in zip(before["nodes"], after["nodes"]):  # any node: a prompt's or the reply's
                touched |= {f"node.{k}" for k in set(old) | set(new) if old.get(k) != new.get(k)}
    assert touched >= set(trace(task)) | {"node.message", "node.parent", "node.sampled", "node.token_ids",
                                          "node.mask", "node.logprobs"}
