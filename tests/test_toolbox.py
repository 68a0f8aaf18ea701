"""Toolbox: every failure of a call (bad JSON, bad arguments, unknown tool, crash, hang, huge output)
comes back as an "Error: <Kind>: detail" tool message plus a RowError; schemas come from signatures."""

import json
import threading
from typing import Literal

import pytest

from hubgym.schemas import make_task, tool_call, user
from hubgym.schemas.messages import TOOL_ERROR_PREFIX
from hubgym.tools import Toolbox, ToolSet, make_toolbox, tool
from hubgym.tools.base import MAX_OUTPUT_CHARS

RELEASE = threading.Event()  # lets the hanging tool's thread finish once its test is over


@tool
def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Args:
        a: the first addend.
        b: the second addend.
    """
    return a + b


@tool
def shout(text: str) -> str:
    """Repeat text loudly."""
    return text.upper() * 2


@tool
def crash(reason: str) -> str:
    """Always fails."""
    raise KeyError(reason)


@tool(timeout_s=0.2)
def hang() -> str:
    """Never answers in time."""
    RELEASE.wait(30)
    return "late"


@tool(name="lookup")
def lookup_fn(names: list[str], mode: Literal["fast", "exact"] = "fast", limit: float | None = None) -> dict:
    """Look keys up.

    Looks each key up in a table and returns what it found.

    Args:
        names: the keys to look up.
        mode: how hard to look.
    """
    return {"names": names, "mode": mode, "limit": limit}


class Counter(ToolSet):
    NAME = "counter"

    def __init__(self, task):
        super().__init__(task)
        self.count = task["info"]["start"]

    @tool
    def bump(self, by: int) -> int:
        """Add `by` to the counter and return it.

        Args:
            by: how much to add.
        """
        self.count += by
        return self.count


BOX = Toolbox([add, shout, crash, hang, lookup_fn])
TASK = make_task("t", [user("q")], {"start": 10})


def _call(box: Toolbox, name: str, arguments: str):
    return box.call(tool_call("call-1", name, arguments))


def _failure(outcome, kind: str) -> str:
    """The detail of a failed call, after checking both records of it agree on the kind."""
    content = outcome.message["content"]
    assert content.startswith(f"{TOOL_ERROR_PREFIX}{kind}: "), content
    assert outcome.error["boundary"] == "tool" and outcome.error["type"] == kind
    assert outcome.message["role"] == "tool" and outcome.message["tool_call_id"] == "call-1"
    return content[len(f"{TOOL_ERROR_PREFIX}{kind}: "):]


def test_good_call_returns_a_tool_message():
    outcome = _call(BOX, "add", '{"a": 2, "b": 40}')
    assert outcome.error is None
    assert outcome.message == {"role": "tool", "content": "42", "tool_call_id": "call-1", "name": "add",
                               "tool_calls": None}


def test_default_and_json_result():
    assert _call(BOX, "add", '{"a": 2}').message["content"] == "3"
    outcome = _call(BOX, "lookup", '{"names": ["x"]}')
    assert json.loads(outcome.message["content"]) == {"names": ["x"], "mode": "fast", "limit": None}


def test_empty_arguments_mean_no_arguments():
    assert _failure(_call(BOX, "add", ""), "InvalidArguments") == "a: Field required"


def test_bad_json():
    detail = _failure(_call(BOX, "add", '{"a": 2,'), "InvalidJSON")
    assert detail.startswith("arguments are not valid JSON (") and "at char 8" in detail


@pytest.mark.parametrize("arguments, detail", [
    ('{"a": "two"}', "a: Input should be a valid integer, unable to parse string as an integer"),
    ('{"b": 1}', "a: Field required"),
    ('{"a": 1, "c": 3}', "c: Extra inputs are not permitted"),
    ('[1, 2]', "arguments: Input should be a valid dictionary or instance of add_arguments"),
])
def test_bad_arguments(arguments, detail):
    assert _failure(_call(BOX, "add", arguments), "InvalidArguments") == detail


def test_bad_literal_names_the_choices():
    detail = _failure(_call(BOX, "lookup", '{"names": ["k"], "mode": "slow"}'), "InvalidArguments")
    assert detail == "mode: Input should be 'fast' or 'exact'"


def test_unknown_tool_lists_the_available_ones():
    detail = _failure(_call(BOX, "delete_everything", "{}"), "UnknownTool")
    assert detail == "no tool named 'delete_everything'; available: ['add', 'crash', 'hang', 'lookup', 'shout']"


def test_crash_is_reported_with_its_exception_type():
    assert _failure(_call(BOX, "crash", '{"reason": "db gone"}'), "KeyError") == "'db gone'"


def test_hang_times_out_without_blocking_the_run():
    try:
        detail = _failure(_call(BOX, "hang", "{}"), "ToolTimeout")
    finally:
        RELEASE.set()
    assert detail == "hang did not finish within 0.2s"


def test_long_output_is_cut_with_a_note():
    outcome = _call(BOX, "shout", json.dumps({"text": "ab" * MAX_OUTPUT_CHARS}))
    content = outcome.message["content"]
    assert outcome.error is None
    assert content == "AB" * (MAX_OUTPUT_CHARS // 2) + f"\n[output cut at {MAX_OUTPUT_CHARS} characters]"


def test_schema_comes_from_signature_and_docstring():
    assert lookup_fn.schema == {"type": "function", "function": {
        "name": "lookup",
        "description": "Look keys up.\n\nLooks each key up in a table and returns what it found.",
        "parameters": {
            "type": "object", "additionalProperties": False, "required": ["names"],
            "properties": {
                "names": {"type": "array", "items": {"type": "string"}, "description": "the keys to look up."},
                "mode": {"type": "string", "enum": ["fast", "exact"], "default": "fast",
                         "description": "how hard to look."},
                "limit": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None},
            }}}}
    assert [s["function"]["name"] for s in BOX.schemas()] == ["add", "shout", "crash", "hang", "lookup"]


def test_tool_needs_a_docstring_and_hints():
    def undocumented(x: int) -> int:
        return x

    def unhinted(x):
        """Has a docstring."""
        return x

    with pytest.raises(TypeError, match="^tool 'undocumented' needs a docstring"):
        tool(undocumented)
    with pytest.raises(TypeError, match="^tool 'unhinted': parameter 'x' needs a type hint$"):
        tool(unhinted)


def test_toolset_state_is_per_rollout():
    first, second = Toolbox(Counter(TASK).bound_tools()), Toolbox(Counter(TASK).bound_tools())
    assert [_call(first, "bump", '{"by": 5}').message["content"] for _ in range(2)] == ["15", "20"]
    assert _call(second, "bump", '{"by": 1}').message["content"] == "11"
    assert "self" not in Counter.bump.schema["function"]["parameters"]["properties"]


def test_registry_builds_a_toolbox_of_builtin_tools():
    box = make_toolbox(["calculator", "python"], TASK)
    assert sorted(box.tools) == ["calculator", "python"]
    assert _call(box, "calculator", '{"expression": "2 ** 10 - 24"}').message["content"] == "1000"
    assert _failure(_call(box, "calculator", '{"expression": "1/0"}'), "ValueError") == "division by zero"
