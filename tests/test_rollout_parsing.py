"""The text tool-call parser (Hermes/Qwen `<tool_call>` blocks) for models without native tool calls."""

from __future__ import annotations

import json

from hubgym.rollout.parsing import parse_tool_calls


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_one_call_is_parsed_and_removed_from_the_content():
    text = "Let me compute.\n" + block('{"name": "calculator", "arguments": {"expression": "12 * 34"}}')

    reply = parse_tool_calls(text, "call-0")

    assert reply.content == "Let me compute."
    assert reply.parse_errors == []
    assert reply.calls == [{"id": "call-0-0", "name": "calculator", "arguments": '{"expression": "12 * 34"}'}]
    assert json.loads(reply.calls[0]["arguments"]) == {"expression": "12 * 34"}


def test_parallel_calls_keep_their_order_and_get_distinct_ids():
    text = (block('{"name": "get_user", "arguments": {"user_id": "ana_1"}}') + "\n"
            + block('{"name": "get_order", "arguments": {"order_id": "#W1"}}') + "\nchecking both")

    reply = parse_tool_calls(text, "call-3")

    assert [(c["id"], c["name"]) for c in reply.calls] == [("call-3-0", "get_user"), ("call-3-1", "get_order")]
    assert [json.loads(c["arguments"]) for c in reply.calls] == [{"user_id": "ana_1"}, {"order_id": "#W1"}]
    assert reply.content == "checking both"


def test_malformed_json_becomes_an_invalid_call_that_keeps_the_raw_text():
    body = '{"name": "calculator", "arguments": {"expression": "1 + 1"}'  # one closing brace short
    reply = parse_tool_calls(block(body), "call-0")

    assert reply.calls == [{"id": "call-0-0", "name": "invalid_tool_call", "arguments": body}]
    assert len(reply.parse_errors) == 1 and reply.parse_errors[0].startswith("JSONDecodeError")


def test_missing_closing_tag_still_parses_a_complete_call():
    reply = parse_tool_calls('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 ** 10"}}', "c")

    assert reply.parse_errors == []
    assert [(c["name"], json.loads(c["arguments"])) for c in reply.calls] == [("calculator", {"expression": "2 ** 10"})]
    assert reply.content == ""


def test_missing_closing_tag_with_cut_json_is_an_invalid_call():
    reply = parse_tool_calls('<tool_call>\n{"name": "calculator", "argu', "c")

    assert [c["name"] for c in reply.calls] == ["invalid_tool_call"]
    assert reply.calls[0]["arguments"] == '{"name": "calculator", "argu'
    assert reply.parse_errors[0].startswith("JSONDecodeError")


def test_non_string_name_is_an_invalid_call():
    reply = parse_tool_calls(block('{"name": 7, "arguments": {}}'), "c")

    assert [c["name"] for c in reply.calls] == ["invalid_tool_call"]
    assert reply.parse_errors == ["TypeError: name must be a string"]


def test_missing_name_and_non_object_json_are_invalid_calls():
    reply = parse_tool_calls(block('{"arguments": {}}') + block('["calculator"]'), "c")

    assert [c["name"] for c in reply.calls] == ["invalid_tool_call", "invalid_tool_call"]
    assert [e.split(":")[0] for e in reply.parse_errors] == ["KeyError", "TypeError"]


def test_arguments_written_as_a_string_are_kept_verbatim_and_missing_ones_default_to_empty():
    reply = parse_tool_calls(block('{"name": "calculator", "arguments": "{\\"expression\\": \\"3\\"}"}')
                             + block('{"name": "get_user"}'), "c")

    assert [c["arguments"] for c in reply.calls] == ['{"expression": "3"}', "{}"]
    assert reply.parse_errors == []


def test_text_without_calls_has_no_calls():
    reply = parse_tool_calls("The answer is <answer>42</answer>. </tool_call>", "c")

    assert reply.calls == [] and reply.parse_errors == []
