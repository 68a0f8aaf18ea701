"""Rollouts through a real vLLM OpenAI-compatible server (one per module) with the tiny model.

Covers the three `OpenAIEngine` modes on single_turn, tool_use and multi_turn envs, native tool
calls parsed by the server's hermes parser, a request the server refuses (recorded on its rows),
an unreachable server, and a server killed mid-run followed by an exact resume.

A random-weight model almost never ends a turn by itself, so most runs constrain its output
with vLLM structured outputs (a regex): replies then end with the end-of-turn token, and
multi-turn episodes and tool calls really happen.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from hubgym.envs import resolve_env
from hubgym.engines import EngineError, OpenAIEngine, SamplingArgs
from hubgym.rollout import RolloutConfig, run_rollouts
from hubgym.rollout.run import rollout_id
from hubgym.engines.server import VLLMServer, free_port
from hubgym.rollout.tokens import ChatRenderer
from hubgym.schemas import validate_rollouts
from hubgym.schemas.rollouts import ROLLOUT_FEATURES
from hubgym.tools.registry import make_toolbox

pytestmark = pytest.mark.slow  # a vLLM server per module

MAX_MODEL_LEN = 2048
CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'
FORCE_CALL = {"structured_outputs": {"regex": CALL_TEXT.replace("{", r"\{").replace("}", r"\}").replace("*", r"\*")}}
FORCE_ANY = {"structured_outputs": {"regex": "<answer>[0-9]{1,3}</answer>|<guess>[a-z]{5}</guess>|" + FORCE_CALL[
    "structured_outputs"]["regex"].replace("12", "[1-9][0-9]").replace("34", "[1-9][0-9]")}}
"""One regex for every env: an answer (single_turn, tool_use), a Wordle guess, or a calculator call."""
ENVS = ["arithmetic:easy", "calc_tools:calculator", "wordle"]
FORCED_CALL_TOKENS = SamplingArgs(max_tokens=96)  # the forced call is ~45-60 tokens, however the grammar splits it


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    with VLLMServer(tiny_model, max_model_len=MAX_MODEL_LEN, tool_parser="hermes", enforce_eager=True,
                    log_path=log) as running:
        yield running


@pytest.fixture(scope="module")
def renderer(tiny_model) -> ChatRenderer:
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))


def _config(server, tmp_path, mode: str, envs=ENVS, **kwargs) -> RolloutConfig:
    defaults = {"n": 2, "limit": 2, "sampling": SamplingArgs(max_tokens=40), "max_model_len": MAX_MODEL_LEN}
    return RolloutConfig(envs=envs, model=str(server.model), out=str(tmp_path / f"run-{mode}"), engine="openai",
                         base_url=server.base_url, mode=mode, **{**defaults, **kwargs})


def _engine(config: RolloutConfig, **kwargs) -> OpenAIEngine:
    return OpenAIEngine(config.model, config.base_url, mode=config.mode, max_model_len=config.max_model_len, **kwargs)


def _rows(config: RolloutConfig) -> list[dict]:
    """Every stored row of the run, after schema validation, decoded (info back to a dict)."""
    shards = sorted((Path(config.out) / "shards").glob("*.arrow"))
    table = pa.concat_tables([pa.ipc.open_file(str(p)).read_all() for p in shards])
    validate_rollouts(table)
    return [ROLLOUT_FEATURES.decode_example(r) for r in table.to_pylist()]


def _task(row: dict) -> dict:
    return {"id": row["task_id"], "env": row["env"], "prompt": row["prompt"], "info": row["info"],
            "interaction": row["interaction"]}


def _tools(row: dict) -> list[dict] | None:
    names = row["interaction"]["tools"]
    return make_toolbox(names, _task(row)).schemas() if names else None


def _check_rows(rows: list[dict], renderer: ChatRenderer) -> None:
    """What every mode must give: aligned token records, masks that say who wrote what, fresh re-scores."""
    for row in rows:
        ids, mask, logprobs = row["completion_ids"], row["completion_mask"], row["completion_logprobs"]
        assert len(ids) == len(mask) == len(logprobs) > 0, row["rollout_id"]
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)
        assert all(lp <= 0.0 for lp in logprobs)
        assert row["prompt_ids"] == renderer.prompt_ids(row["prompt"], _tools(row)), "server and local template differ"
        assert row["error"] is None
        rescored = resolve_env(row["env"]).verifier().score(_task(row), row["completion"])
        assert row["reward"] == pytest.approx(rescored.reward)


def _segments(row: dict, mask: int) -> list[list[int]]:
    """The runs of consecutive completion ids whose mask is `mask` (1: one model turn each)."""
    runs: list[list[int]] = []
    for i, (token, m) in enumerate(zip(row["completion_ids"], row["completion_mask"])):
        if m == mask:
            if i == 0 or row["completion_mask"][i - 1] != mask:
                runs.append([])
            runs[-1].append(token)
    return runs


def _by_key(rows: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["task_id"], r["sample"]): r for r in rows}


def test_token_in_modes_store_consistent_multi_turn_rollouts(server, renderer, tmp_path):
    """`tokens` (/v1/completions) and `chat_tokens` (/v1/chat/completions with the stored ids as the
    prompt) are both token-in: same seeds, so the same sampled tokens and the same tool/env tokens."""
    runs = {}
    for mode in ("tokens", "chat_tokens"):
        config = _config(server, tmp_path, mode)
        summary = run_rollouts(config, engine=_engine(config, extra_body=FORCE_ANY), progress=False)
        rows = runs[mode] = _rows(config)
        assert summary.written == len(rows) == len(ENVS) * 2 * 2
        _check_rows(rows, renderer)
        assert all(r["tokens_consistent"] for r in rows)
        assert {r["interaction"]["kind"] for r in rows} == {"single_turn", "tool_use", "multi_turn"}
        for row in (r for r in rows if r["env"] == "wordle"):  # every forced guess ends its turn: the episode goes on
            assert row["num_turns"] >= 2 and 0 in row["completion_mask"]
            assert sum(m["role"] == "user" for m in row["completion"]) >= row["num_turns"] - 1
    tokens, chat_tokens = _by_key(runs["tokens"]), _by_key(runs["chat_tokens"])
    assert tokens.keys() == chat_tokens.keys()
    for key, row in tokens.items():
        other = chat_tokens[key]
        assert (row["prompt_ids"], row["completion_ids"], row["completion_mask"]) == (
            other["prompt_ids"], other["completion_ids"], other["completion_mask"])
        assert row["completion_logprobs"] == pytest.approx(other["completion_logprobs"], abs=1e-3)
        assert row["reward"] == other["reward"]


def test_native_tool_calls_are_parsed_by_the_server_and_answered_with_mask_0(server, renderer, tmp_path):
    """The forced reply is a real Hermes tool call: vLLM's parser returns it as `tool_calls`, the
    toolbox runs it, and its result goes back into the token record as template tokens (mask 0)."""
    config = _config(server, tmp_path, "chat_tokens", envs=["calc_tools:calculator"], sampling=FORCED_CALL_TOKENS)
    run_rollouts(config, engine=_engine(config, extra_body=FORCE_CALL), progress=False)
    rows = _rows(config)
    _check_rows(rows, renderer)
    for row in rows:
        assert row["tokens_consistent"] and row["num_turns"] == row["interaction"]["max_turns"]
        calls = [m for m in row["completion"] if m["role"] == "assistant"]
        results = [m for m in row["completion"] if m["role"] == "tool"]
        assert len(calls) == len(results) == row["num_turns"]
        for call, result in zip(calls, results):
            (parsed,) = call["tool_calls"]
            assert parsed["id"].startswith("chatcmpl-tool-"), "not parsed by the server"
            assert (parsed["name"], json.loads(parsed["arguments"])) == ("calculator", {"expression": "12 * 34"})
            assert (result["tool_call_id"], result["content"]) == (parsed["id"], "408")
        env_text = [renderer.tokenizer.decode(ids) for ids in _segments(row, 0)]
        answered = [text.count("<tool_response>\n408\n</tool_response>") for text in env_text]
        assert answered == [1] * (row["num_turns"] - 1)  # the last turn's result ends the run: no tokens needed
        model_text = [renderer.tokenizer.decode(ids) for ids in _segments(row, 1)]
        assert [text.count(CALL_TEXT) for text in model_text] == [1] * row["num_turns"]  # one turn per segment
        metrics = {m["name"]: m["value"] for m in row["metrics"]}
        assert (metrics["loop/tool_calls"], metrics["loop/tool_errors"]) == (row["num_turns"], 0)
        assert row["reward"] == pytest.approx(0.2)  # two rewarded calls; 408 is not the answer


def test_chat_mode_flags_replies_the_server_retokenizes_differently(server, renderer, tmp_path):
    """In `chat` mode the server renders each turn from messages. The template is prefix-consistent
    as text, but the model's sampled ids are often not the canonical tokenization of its reply, so the
    next prompt does not extend the stored tokens: the loop must flag it (`tokens_consistent` False)."""
    config = _config(server, tmp_path, "chat", envs=["calc_tools:calculator"], sampling=FORCED_CALL_TOKENS)
    run_rollouts(config, engine=_engine(config, extra_body=FORCE_CALL), progress=False)
    rows = _rows(config)
    _check_rows(rows, renderer)
    assert all(len(r["completion"]) == 2 * r["interaction"]["max_turns"] for r in rows)
    drifted = [r for r in rows if not r["tokens_consistent"]]
    assert drifted, "forced tool calls were expected to be sampled in a non-canonical tokenization"
    tokenizer = renderer.tokenizer
    for row in drifted:
        turns = _segments(row, 1)
        assert all(CALL_TEXT in tokenizer.decode(ids) for ids in turns)  # the text is right...
        assert any(tokenizer.encode(tokenizer.decode(ids, skip_special_tokens=True), add_special_tokens=False)
                   != [t for t in ids if t != tokenizer.eos_token_id] for ids in turns)  # ...some tokenization is not


def test_a_refused_request_is_recorded_on_its_rows_and_the_run_goes_on(server, tmp_path):
    """retail's prompt (~2.7k tokens) is longer than the server's context: HTTP 400 for those rows only."""
    config = _config(server, tmp_path, "tokens", envs=["arithmetic:easy", "retail"], limit=1, max_model_len=4096)
    summary = run_rollouts(config, progress=False)
    rows = _rows(config)
    assert summary.written == len(rows) == 4
    for row in rows:
        if row["env"] == "retail":
            assert row["reward"] is None and row["finish_reason"] == "error"
            assert (row["error"]["boundary"], row["error"]["type"]) == ("engine", "RequestError")
            assert server.base_url in row["error"]["message"] and "maximum context length" in row["error"]["message"]
        else:
            assert row["error"] is None and row["reward"] is not None


def test_an_unreachable_server_fails_after_the_retries_and_leaves_a_resumable_run(tiny_model, tmp_path, caplog):
    url = f"http://127.0.0.1:{free_port()}/v1"
    config = RolloutConfig(envs=["arithmetic:easy"], model=str(tiny_model), out=str(tmp_path / "run"), engine="openai",
                           base_url=url, n=2, limit=1, sampling=SamplingArgs(max_tokens=8))
    caplog.set_level(logging.INFO, logger="hubgym.engines.http_json")
    with pytest.raises(EngineError, match=f"^OpenAI-compatible server at {url} failed after 2 retries "):
        run_rollouts(config, engine=_engine(config, max_retries=2), progress=False)
    retries = [r for r in caplog.records if r.getMessage().startswith("Retrying request")]
    assert len(retries) == 2
    manifest = json.loads((tmp_path / "run" / "manifest-w000of001.json").read_text())
    assert (manifest["run_id"], manifest["rows"]) == (config.run_id(), 0)
    assert list((tmp_path / "run" / "shards").iterdir()) == []


class _KillingEngine(OpenAIEngine):
    """Kills the real server just before its `kill_at`-th request: a crash in the middle of a run."""

    def __init__(self, config: RolloutConfig, server: VLLMServer, kill_at: int):
        super().__init__(config.model, config.base_url, mode=config.mode, max_model_len=config.max_model_len,
                         max_retries=1)
        self.server, self.kill_at, self.calls = server, kill_at, 0

    async def generate(self, request, sampling):
        self.calls += 1
        if self.calls == self.kill_at:
            self.server.kill()
        return await super().generate(request, sampling)


def test_a_server_killed_mid_run_stops_it_and_a_fresh_server_completes_it_exactly(server, tmp_path):
    config = _config(server, tmp_path, "tokens", envs=["arithmetic:easy"], limit=8, concurrency=1,
                     max_rows_per_shard=2, sampling=SamplingArgs(max_tokens=8))
    with pytest.raises(EngineError, match=f"server at {server.base_url} failed after 1 retries"):
        run_rollouts(config, engine=_KillingEngine(config, server, kill_at=4), progress=False)
    assert not server.running()
    assert len(_rows(config)) == 3 * 2  # the three groups finished before the crash are stored

    server.start()  # a fresh server at the same address
    summary = run_rollouts(config, progress=False)
    assert (summary.skipped, summary.written) == (3 * 2, 5 * 2)
    rows = _rows(config)
    ids = [r["rollout_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 8 * 2
    tasks = {r["task_id"] for r in rows}
    assert set(ids) == {rollout_id(config.run_id(), t, i) for t in tasks for i in range(2)}
