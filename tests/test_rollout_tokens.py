"""ChatRenderer and TokenRecord with the real tiny tokenizer: prompt ids, the tokens between turns
(tool results, env observations), end-of-turn handling, and templates that are not prefix-consistent."""

from __future__ import annotations

import copy

import pytest

from hubgym.rollout.tokens import ChatRenderer, TokenRecord, recent_context
from hubgym.schemas import assistant, system, tool_call, tool_result, user

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {
                                               "expression": {"type": "string"}}, "required": ["expression"]}}}]
HISTORY = [system("Use the calculator."), user("What is 12 * 34?")]
CONTENT_LINE = "{% if message.content %}{{ message.content }}{% endif -%}"
STRIP_EARLIER_REASONING = ("{% if message.content %}{{ message.content.split('</think>')[-1] if not loop.last "
                           "else message.content }}{% endif -%}")
"""Like Qwen3's template: an assistant turn's <think> part is dropped once the turn is no longer the last."""


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def renderer(tokenizer) -> ChatRenderer:
    return ChatRenderer(tokenizer)


@pytest.fixture(scope="module")
def stripping_renderer(tokenizer) -> ChatRenderer:
    changed = copy.deepcopy(tokenizer)
    if CONTENT_LINE not in changed.chat_template:
        raise RuntimeError("the tiny model's chat template changed: update CONTENT_LINE")
    changed.chat_template = changed.chat_template.replace(CONTENT_LINE, STRIP_EARLIER_REASONING)
    return ChatRenderer(changed)


def decode(renderer: ChatRenderer, ids: list[int]) -> str:
    return renderer.tokenizer.decode(ids, skip_special_tokens=False)


def sampled(renderer: ChatRenderer, text: str, eos: bool = True) -> list[int]:
    """What a model samples for `text`: its tokens, then the end-of-turn token."""
    return renderer.encode(text) + ([renderer.tokenizer.eos_token_id] if eos else [])


def test_prompt_ids_are_the_template_rendering_with_the_generation_prompt(renderer, tokenizer):
    ids = renderer.prompt_ids(HISTORY, TOOLS)
    text = decode(renderer, ids)

    assert text == tokenizer.apply_chat_template([{"role": "system", "content": "Use the calculator."},
                                                  {"role": "user", "content": "What is 12 * 34?"}],
                                                 tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nUse the calculator.\n\n# Tools")
    assert '"name": "calculator"' in text
    assert text.endswith("<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in ids  # special tokens are single ids, not spelled out


def test_turn_closing_and_template_hash(renderer, stripping_renderer):
    assert renderer.turn_closing == "<|im_end|>\n"
    assert renderer.eos_text == "<|im_end|>"
    assert len(renderer.template_sha256) == 64
    assert renderer.template_sha256 != stripping_renderer.template_sha256


def test_bridge_across_a_tool_result_matches_the_full_rendering(renderer):
    reply = assistant("", [tool_call("call-0-0", "calculator", '{"expression": "12 * 34"}')])
    new = [tool_result("408", "call-0-0", "calculator")]

    ids, problem = renderer.bridge(HISTORY, reply, new, TOOLS, ended_with_eos=True)

    assert problem is None
    assert decode(renderer, ids) == ("\n<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<|im_end|>\n"
                                     "<|im_start|>assistant\n")
    whole = renderer.prompt_ids(HISTORY, TOOLS) + sampled(renderer, CALL) + ids
    assert decode(renderer, whole) == renderer.render(HISTORY + [reply] + new, TOOLS, add_generation_prompt=True)


def test_bridge_across_parallel_tool_results_is_one_user_turn(renderer):
    calls = [tool_call("call-0-0", "calculator", '{"expression": "12 * 34"}'),
             tool_call("call-0-1", "calculator", '{"expression": "1 + 1"}')]
    new = [tool_result("408", "call-0-0", "calculator"), tool_result("2", "call-0-1", "calculator")]

    ids, problem = renderer.bridge(HISTORY, assistant("", calls), new, TOOLS, ended_with_eos=True)

    assert problem is None
    assert decode(renderer, ids) == ("\n<|im_start|>user\n<tool_response>\n408\n</tool_response>\n"
                                     "<tool_response>\n2\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n")


def test_bridge_across_an_env_observation(renderer):
    history = [user("Guess the word.")]
    reply = assistant("<guess>crane</guess>")
    observation = user("crane: XGYXX. 5 guesses left.")

    ids, problem = renderer.bridge(history, reply, [observation], None, ended_with_eos=True)

    assert problem is None
    assert decode(renderer, ids) == ("\n<|im_start|>user\ncrane: XGYXX. 5 guesses left.<|im_end|>\n"
                                     "<|im_start|>assistant\n")
    whole = renderer.prompt_ids(history, None) + sampled(renderer, reply["content"]) + ids
    assert decode(renderer, whole) == renderer.render(history + [reply, observation], None, add_generation_prompt=True)


def test_eos_is_added_only_when_the_model_did_not_sample_it(renderer, tokenizer):
    reply, new = assistant("<guess>crane</guess>"), [user("XGYXX")]

    with_eos, _ = renderer.bridge([user("go")], reply, new, None, ended_with_eos=True)
    without_eos, _ = renderer.bridge([user("go")], reply, new, None, ended_with_eos=False)

    assert with_eos[0] != tokenizer.eos_token_id
    assert without_eos[0] == tokenizer.eos_token_id and without_eos[1:] == with_eos
    for model_ids, bridge_ids in ((sampled(renderer, "<guess>crane</guess>"), with_eos),
                                  (sampled(renderer, "<guess>crane</guess>", eos=False), without_eos)):
        assert (model_ids + bridge_ids).count(tokenizer.eos_token_id) == 2  # reply closed once, observation once


def test_bridge_with_no_new_messages_is_the_closing_and_the_generation_prompt(renderer):
    ids, problem = renderer.bridge([user("go")], assistant("ok"), [], None, ended_with_eos=True)

    assert problem is None
    assert decode(renderer, ids) == "\n<|im_start|>assistant\n"


def test_a_template_that_drops_earlier_reasoning_is_flagged_and_the_history_is_not_copied(stripping_renderer):
    history = [user("Guess the word.")]
    reply = assistant("<think>maybe crane</think><guess>crane</guess>")
    observation = user("crane: XGYXX")

    ids, problem = stripping_renderer.bridge(history, reply, [observation], None, ended_with_eos=True)

    assert problem is not None and problem.startswith("chat template is not prefix-consistent")
    # The stored tokens keep what the model sampled and append only the new turn, not a rewritten reply.
    assert decode(stripping_renderer, ids) == "\n<|im_start|>user\ncrane: XGYXX<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_drops_earlier_reasoning_is_flagged_across_tool_results(stripping_renderer):
    reply = assistant("<think>use the tool</think>", [tool_call("c-0", "calculator", '{"expression": "12 * 34"}')])

    ids, problem = stripping_renderer.bridge(HISTORY, reply, [tool_result("408", "c-0", "calculator")], TOOLS, True)

    assert problem is not None
    assert decode(stripping_renderer, ids) == (
        "\n<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n")


def test_the_same_reply_without_reasoning_is_consistent_under_the_stripping_template(stripping_renderer, renderer):
    reply, new = assistant("<guess>crane</guess>"), [user("XGYXX")]

    ids, problem = stripping_renderer.bridge([user("go")], reply, new, None, ended_with_eos=True)

    assert problem is None
    assert ids == renderer.bridge([user("go")], reply, new, None, ended_with_eos=True)[0]


def _wordle_turns(count: int) -> list[tuple[list, dict, list]]:
    """(history, reply, new messages) of each turn of a multi_turn episode `count` turns long."""
    history, turns = [system("Play Wordle."), user("Guess the word.")], []
    for turn in range(count):
        reply, new = assistant(f"<guess>w{turn:04d}</guess>"), [user(f"w{turn:04d}: XXXXX. {count - turn} left.")]
        turns.append((list(history), reply, new))
        history += [reply, *new]
    return turns


def test_recent_context_keeps_the_system_message_and_the_turns_since_the_last_user_message():
    reply, tool = assistant("", [tool_call("c", "calculator", "{}")]), tool_result("1", "c", "calculator")
    assert recent_context(HISTORY) == HISTORY
    assert recent_context(HISTORY + [reply, tool]) == HISTORY + [reply, tool]
    episode = _wordle_turns(4)[-1][0]
    assert recent_context(episode) == [episode[0], episode[-1]]
    assert recent_context([assistant("hi")]) == [assistant("hi")]  # no user message: the whole history


def test_incremental_bridges_are_the_full_bridges_and_render_only_the_recent_turns(tokenizer, monkeypatch):
    renderer, longest = ChatRenderer(tokenizer), []
    full = [renderer._bridge(history, reply, new, None, True) for history, reply, new in _wordle_turns(12)]
    render = renderer.render
    monkeypatch.setattr(renderer, "render", lambda messages, *a, **k: longest.append(len(messages)) or render(
        messages, *a, **k))

    assert [renderer.bridge(history, reply, new, None, True) for history, reply, new in _wordle_turns(12)] == full
    assert renderer.incremental and renderer._checks_left == ChatRenderer.INCREMENTAL_CHECKS - 11  # turn 1 is short
    longest.clear()
    history, reply, new = _wordle_turns(40)[-1]
    renderer._checks_left = 0
    renderer.bridge(history, reply, new, None, True)
    assert max(longest) == 4  # system, the last observation, the reply, the new observation: not 80 messages


def test_a_template_that_looks_further_back_falls_back_to_full_renders(tokenizer):
    numbered = copy.deepcopy(tokenizer)
    line = "<|im_start|>{{ message.role }}\n"
    if line not in numbered.chat_template:
        raise RuntimeError("the tiny model's chat template changed: update the numbered line")
    numbered.chat_template = numbered.chat_template.replace(line, "<|im_start|>{{ message.role }} {{ loop.index }}\n")
    renderer = ChatRenderer(numbered)
    turns = _wordle_turns(6)

    bridges = [renderer.bridge(history, reply, new, None, True) for history, reply, new in turns]

    assert not renderer.incremental  # the first check found the short context renders turn numbers differently
    assert bridges == [renderer._bridge(history, reply, new, None, True) for history, reply, new in turns]
    assert "user 6" in decode(renderer, bridges[1][0])


def test_token_record_keeps_ids_mask_and_logprobs_aligned():
    record = TokenRecord([1, 2, 3])
    record.add_model([10, 11], [-0.5, -1.25])
    record.add_env([20, 21, 22])
    record.add_model([12], [-2.0])

    assert record.sequence() == [1, 2, 3, 10, 11, 20, 21, 22, 12]
    assert record.mask == [1, 1, 0, 0, 0, 1]
    assert record.logprobs == [-0.5, -1.25, 0.0, 0.0, 0.0, -2.0]
    assert len(record.completion_ids) == len(record.mask) == len(record.logprobs)
    assert record.consistent and record.problems == []


def test_token_record_refuses_misaligned_logprobs_and_records_problems():
    record = TokenRecord([1])
    with pytest.raises(ValueError, match="^engine returned 2 token ids but 1 logprobs$"):
        record.add_model([5, 6], [-1.0])
    assert record.completion_ids == [] and record.mask == [] and record.logprobs == []

    record.mark_inconsistent("turn 2: template rewrote turn 1")
    assert not record.consistent and record.problems == ["turn 2: template rewrote turn 1"]
