"""The instant benchmark server: it answers what vLLM answers for the fields the clients read, its replies are
valid moves chosen by the request alone, and real rollouts against it store rows that pass the token audit."""

from __future__ import annotations

import _thread
import asyncio
import dataclasses
import signal
import threading
from pathlib import Path

import openai
import pyarrow as pa
import pytest
from transformers import AutoTokenizer

from hubgym.engines import EngineError, OpenAIEngine, SamplingArgs
from hubgym.rollout import RolloutConfig, run_rollouts
from hubgym.engines import Request
from hubgym.rollout.instant_replies import ReplyBook, tictactoe_text
from hubgym.rollout.instant_server import InstantServer
from hubgym.rollout.tokens import ChatRenderer, audit_tokens
from hubgym.schemas import user, validate_rollouts
from hubgym.schemas.rollouts import ROLLOUT_FEATURES
from hubgym.verifiers.tictactoe import parse_move, render

pytestmark = pytest.mark.slow  # the instant server in a child process

CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                               "parameters": {"type": "object",
                                                              "properties": {"expression": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    with InstantServer(tiny_model, log_path=tmp_path_factory.mktemp("instant") / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def test_the_plain_openai_client_reads_a_hermes_tool_call_with_token_ids_and_logprobs(server, tokenizer):
    client = openai.OpenAI(base_url=server.url("calc_tools"), api_key="EMPTY")
    messages = [{"role": "user", "content": "What is 123 * 456?"}]
    reply = client.chat.completions.create(model=server.model, messages=messages, tools=[CALCULATOR], logprobs=True,
                                           extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls[0].function.name == "calculator"
    assert '"expression"' in choice.message.tool_calls[0].function.arguments
    token_ids = choice.model_extra["token_ids"]
    assert token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len(choice.logprobs.content) == len(token_ids) and all(t.logprob < 0 for t in choice.logprobs.content)
    rendered = tokenizer.apply_chat_template(messages, tools=[CALCULATOR], add_generation_prompt=True, tokenize=False)
    assert reply.model_extra["prompt_token_ids"] == tokenizer.encode(rendered, add_special_tokens=False)

    completion = client.completions.create(model=server.model, prompt=reply.model_extra["prompt_token_ids"], n=3,
                                           max_tokens=64, logprobs=0, extra_body={"return_token_ids": True})
    assert [c.model_extra["token_ids"] for c in completion.choices] == [token_ids] * 3
    assert completion.choices[0].text.startswith("<tool_call>") and completion.choices[0].finish_reason == "stop"
    assert client.models.list().data[0].id == server.model


def test_a_reply_longer_than_max_tokens_is_cut_with_finish_reason_length(server):
    client = openai.OpenAI(base_url=server.url("wordle"), api_key="EMPTY")
    reply = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "go"}],
                                           max_tokens=2, extra_body={"return_token_ids": True})
    assert reply.choices[0].finish_reason == "length" and len(reply.choices[0].model_extra["token_ids"]) == 2


@pytest.mark.parametrize("mode", ["tokens", "chat", "chat_tokens"])
def test_every_engine_mode_gets_well_formed_samples(server, tokenizer, mode):
    renderer = ChatRenderer(tokenizer)
    messages = [user("Guess the secret word. You have 6 guesses.")]
    engine = OpenAIEngine(server.model, server.url("wordle"), mode=mode, max_model_len=2048)
    request = Request(renderer.prompt_ids(messages, None), messages, None, n=2, max_tokens=32, seed=0)
    samples = asyncio.run(engine.generate(request, SamplingArgs()))
    assert len(samples) == 2
    for sample in samples:
        assert sample.text.startswith("<guess>") and sample.finish_reason == "stop"
        assert len(sample.token_ids) == len(sample.logprobs) and renderer.ends_turn(sample.token_ids)
        assert sample.prompt_ids == request.ids  # the server's rendering is the local one


def test_a_wrong_route_stops_the_run_with_an_engine_error(server):
    engine = OpenAIEngine(server.model, f"http://127.0.0.1:{server.port}/nowhere/v1", max_model_len=2048)
    request = Request([1, 2, 3], [], None, n=1, max_tokens=8, seed=0)
    with pytest.raises(EngineError, match="failed after 4 retries .*ServerRefused: Error code: 404"):
        asyncio.run(engine.generate(request, SamplingArgs()))


def test_tictactoe_replies_name_a_free_cell_of_the_last_board():
    for board in ("X.O.X.O..", "XOXOXO...", "........O"):
        cell = parse_move(tictactoe_text(1, f"You played 1.\n{render(board)}\nYour move."))
        assert board[cell] == "."


def test_replies_depend_on_the_turn_and_the_last_message_only(tokenizer):
    book = ReplyBook("calc_tools", tokenizer)
    assert book.pick(0, "What is 2 * 3?") is book.pick(0, "What is 2 * 3?")  # tokenized once
    assert book.pick(0, "q").tool_calls and book.pick(1, "56088").text == "<answer>56088</answer>"
    with pytest.raises(ValueError, match="no replies for env 'gsm8k'"):
        ReplyBook("gsm8k", tokenizer)


def _rows(out: Path) -> list[dict]:
    table = pa.concat_tables([pa.ipc.open_file(str(p)).read_all() for p in sorted((out / "shards").glob("*.arrow"))])
    validate_rollouts(table)
    return [ROLLOUT_FEATURES.decode_example(r) for r in table.to_pylist()]


@pytest.mark.parametrize("env", ["calc_tools:calculator", "wordle", "tictactoe"])
def test_rollouts_against_it_store_valid_rows_that_pass_the_token_audit_in_both_modes(server, tokenizer, tmp_path, env):
    renderer, turns = ChatRenderer(tokenizer), {}
    for mode in ("tokens", "chat"):
        out = tmp_path / mode
        config = RolloutConfig(envs=[env], model=server.model, out=str(out), engine="openai", mode=mode, n=2,
                               limit=3, split="train", base_url=server.url(env), max_model_len=2048,
                               sampling=SamplingArgs(max_tokens=64), concurrency=2)
        summary = run_rollouts(config, progress=False)
        rows = _rows(out)
        assert summary.written == len(rows) == 6
        for row in rows:
            assert row["error"] is None and row["tokens_consistent"], row["rollout_id"]
            assert audit_tokens(row, renderer).ok  # what `hubgym replay` checks
            assert row["num_turns"] >= 2
        turns[mode] = sorted((r["task_id"], r["sample"], r["num_turns"]) for r in rows)
    assert turns["tokens"] == turns["chat"]  # the same trajectory whichever way the client asks


def test_a_run_started_where_an_event_loop_runs_completes_and_its_interrupt_stores_whole_groups(server, tmp_path):
    """As from a notebook's cell, whose thread runs an event loop (asyncio.run refuses to start another there): the
    run goes on; the notebook's interrupt (KeyboardInterrupt in that thread) stops it after the first group with
    every finished group stored whole, and the same call then completes the run, each rollout once."""
    config = RolloutConfig(envs=["wordle"], model=server.model, out=str(tmp_path / "run"), engine="openai", n=2,
                           limit=6, split="train", base_url=server.url("wordle"), max_model_len=2048,
                           sampling=SamplingArgs(max_tokens=64), concurrency=1)

    class InterruptAfterFirstGroup:
        def started(self, groups: int, stored: int) -> None:
            pass

        def advanced(self, rows, tokens: int) -> None:
            if not interrupted:
                interrupted.append(len(rows))
                _thread.interrupt_main()  # what a notebook's interrupt does: SIGINT's handler in the main thread
                assert seen.wait(60)  # the next groups start once the waiting thread has the KeyboardInterrupt

    def on_sigint(signum, frame):
        seen.set()
        raise KeyboardInterrupt

    async def cell(listener=None):
        return run_rollouts(config, progress=False, listener=listener)

    interrupted: list[int] = []
    seen = threading.Event()
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(cell(InterruptAfterFirstGroup()))
    finally:
        signal.signal(signal.SIGINT, previous)
    stopped = len(_rows(tmp_path / "run"))
    assert interrupted == [2] and 2 <= stopped < 12 and stopped % 2 == 0

    summary = asyncio.run(cell())
    ids = [row["rollout_id"] for row in _rows(tmp_path / "run")]
    assert summary.skipped == stopped and summary.written == 12 - stopped
    assert len(ids) == 12 and len(set(ids)) == 12


def test_a_model_hubgym_makes_is_named_in_python_as_on_the_command_line(server, tmp_path):
    """`model="tiny"` in a RolloutConfig is the tiny model's folder, as `--model tiny` is: the run samples from
    it (here the server that serves that folder) and has the run id the command line's config gives."""
    named = RolloutConfig(envs=["wordle"], model="tiny", out=str(tmp_path / "run"), engine="openai", n=2, limit=1,
                          split="train", base_url=server.url("wordle"), max_model_len=2048,
                          sampling=SamplingArgs(max_tokens=64))
    summary = run_rollouts(named, progress=False)
    assert summary.written == 2 and server.model != "tiny"
    assert summary.run_id == dataclasses.replace(named, model=server.model).run_id() == named.run_id()
