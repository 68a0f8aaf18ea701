"""Rollouts with the real vLLM offline engine and the tiny local model, for every built-in env kind.

One engine serves the whole module. A random-weight model never writes a tool call or a valid
move by itself, so some tests force the reply's text with vLLM structured outputs (a regex per
request, added by `ForcedVLLMEngine` through `VLLMEngine.sampling_params`); the tokens, logprobs
and finish reasons still come from the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import copy
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from hubgym.envs.build import build_tasks
from hubgym.envs import resolve_env
from hubgym.errors import ToolNotFoundError
from hubgym.engines import SamplingArgs, VLLMEngine
from hubgym.rollout import ChatRenderer, LoopContext, RolloutConfig, run_group, run_rollouts
from hubgym.engines import Request
from hubgym.hub.rollout_stats import shard_files
from hubgym.envs import open_env
from hubgym.rollout.run import rollout_id
from hubgym.schemas import validate_rollouts
from hubgym.verifiers.contract import load_verifier

pytestmark = pytest.mark.slow  # its fixtures start vLLM

BROKEN_ENVS = Path(__file__).parent / "broken_envs"
MAX_MODEL_LEN = 4096  # retail's prompt (system + 7 tool schemas) is ~2.7k tokens
ALL_ENVS = ["arithmetic:easy", "gsm8k", "reverse_text", "calc_tools", "retail", "wordle", "tictactoe"]
KINDS = {"arithmetic": "single_turn", "gsm8k": "single_turn", "reverse_text": "single_turn", "calc_tools": "tool_use",
         "retail": "tool_use", "wordle": "multi_turn", "tictactoe": "multi_turn"}
Constraint = Callable[[Request], "str | None"]


class ForcedVLLMEngine(VLLMEngine):
    """The real vLLM engine, plus: a regex per request (structured outputs) chosen by `constrain`, and a
    log of the token ids of every sample it returned (to check the stored records against)."""

    def __init__(self, model: str, **kwargs):
        super().__init__(model, **kwargs)
        self.constrain: Constraint | None = None
        self.sampled: list[list[int]] = []
        self.requests = 0

    def sampling_params(self, request: Request, sampling: SamplingArgs):
        from vllm.sampling_params import StructuredOutputsParams

        params = super().sampling_params(request, sampling)
        regex = self.constrain(request) if self.constrain else None
        if regex is not None:
            params.structured_outputs = StructuredOutputsParams(regex=regex)
        return params

    async def generate(self, request: Request, sampling: SamplingArgs):
        self.requests += 1
        samples = await super().generate(request, sampling)
        self.sampled += [s.token_ids for s in samples]
        return samples


def literal(text: str) -> str:
    """A regex matching exactly `text` (escapes that vLLM's regex grammars accept)."""
    return re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\1", text).replace("\n", r"\n")


def call_regex(name: str, arguments: str) -> str:
    return literal('<tool_call>\n{"name": "' + name + '", "arguments": ') + arguments + literal("}\n</tool_call>")


# ---------------------------------------------------------------- fixtures and helpers

RESUME_SCRIPT = textwrap.dedent("""
    import json, sys
    from pydantic import TypeAdapter
    from hubgym.engines import VLLMEngine
    from hubgym.rollout import RolloutConfig, run_rollouts

    if __name__ == "__main__":
        config = TypeAdapter(RolloutConfig).validate_python(json.loads(sys.argv[1]))
        engine = VLLMEngine(config.model, max_model_len=config.max_model_len, enforce_eager=True)
        print("engine ready", flush=True)
        run_rollouts(config, engine=engine, progress=False)
        print("run finished", flush=True)
""")


WATCH_S = 1800  # a generous bound: on a loaded machine the subprocess's engine alone can take minutes to start


class KilledRun:
    """A rollout run in a subprocess, SIGKILLed by a watcher thread as soon as its first shard appears.
    Started before this module's engine loads, so the two engine start-ups overlap. The run gets its own
    process group and the whole group is killed: vLLM's engine-core process dies with it, as in a crash."""

    def __init__(self, config: RolloutConfig, script: Path):
        fields = dataclasses.asdict(config)
        script.write_text(RESUME_SCRIPT)
        self.config, self.log = config, script.with_suffix(".log")
        self.process = subprocess.Popen([sys.executable, str(script), json.dumps(fields)], stdout=self.log.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self.killed_at_shards: list[str] = []
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        shards = Path(self.config.out) / "shards"
        deadline = time.monotonic() + WATCH_S
        while self.process.poll() is None and time.monotonic() < deadline:
            if shards.is_dir() and any(not p.name.startswith(".") for p in shards.iterdir()):
                self.kill()
                self.killed_at_shards = sorted(p.name for p in shards.iterdir() if not p.name.startswith("."))
                break
            time.sleep(0.01)

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the session id is the child's pid
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        self.watcher.join(timeout=WATCH_S + 20)
        if self.process.poll() is None:
            self.kill()
        return self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def killed_run(tiny_model, tmp_path_factory) -> KilledRun:
    out = tmp_path_factory.mktemp("resume")
    config = RolloutConfig(envs=["arithmetic:easy", "reverse_text"], model=str(tiny_model), out=str(out / "run"), n=2,
                           limit=8, sampling=SamplingArgs(max_tokens=32), max_model_len=MAX_MODEL_LEN,
                           max_rows_per_shard=2, concurrency=1)
    run = KilledRun(config, out / "run_and_die.py")
    yield run
    run.kill()  # whatever happened, leave no engine process behind
    run.process.wait(timeout=60)


@pytest.fixture(scope="module")
def engine(tiny_model, killed_run) -> ForcedVLLMEngine:
    engine = ForcedVLLMEngine(str(tiny_model), max_model_len=MAX_MODEL_LEN, enforce_eager=True)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def renderer(engine) -> ChatRenderer:
    return ChatRenderer(engine.tokenizer)


def run(engine: ForcedVLLMEngine, out: Path, envs: list[str], constrain: Constraint | None = None, *, n: int = 2,
        limit: int = 2, max_tokens: int = 16, **fields):
    """One rollout run on the shared engine; returns (summary, rows of every shard, samples the engine made)."""
    engine.constrain, engine.sampled = constrain, []
    config = RolloutConfig(envs=envs, model=engine.model, out=str(out), n=n, limit=limit,
                           sampling=SamplingArgs(max_tokens=max_tokens), **{"max_model_len": MAX_MODEL_LEN, **fields})
    summary = run_rollouts(config, engine=engine, progress=False)
    engine.constrain = None
    return summary, read_rows(out), list(engine.sampled)


def read_rows(out: Path) -> list[dict]:
    rows = []
    for path in shard_files([out]):
        table = pa.ipc.open_file(str(path)).read_all()
        validate_rollouts(table)
        rows += table.to_pylist()
    return rows


def spans(row: dict, value: int) -> list[list[int]]:
    """The runs of completion tokens whose mask equals `value`, in order."""
    out: list[list[int]] = []
    previous = None
    for token, mask in zip(row["completion_ids"], row["completion_mask"]):
        if mask == value:
            if previous != value:
                out.append([])
            out[-1].append(token)
        previous = mask
    return out


def text(renderer: ChatRenderer, ids: list[int]) -> str:
    return renderer.tokenizer.decode(ids, skip_special_tokens=False)


def tasks_by_id(envs: list[str], limit: int) -> dict[str, dict]:
    opened = [open_env(spec) for spec in envs]
    return {t["id"]: (t, e.verifier) for e in opened for t in e.take("test", limit)}


def check_token_record(row: dict, sampled: list[list[int]]) -> None:
    """Lengths agree; model tokens are whole engine samples with their logprobs; tool/env tokens have logprob 0."""
    ids, mask, logprobs = row["completion_ids"], row["completion_mask"], row["completion_logprobs"]
    assert len(ids) == len(mask) == len(logprobs), row["rollout_id"]
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0), row["rollout_id"]
    assert all(lp <= 0.0 for lp in logprobs) and any(lp < 0.0 for lp in logprobs) == (sum(mask) > 0)
    model_spans = spans(row, 1)
    assert len(model_spans) == row["num_turns"], row["rollout_id"]
    assert all(span in sampled for span in model_spans), f"{row['rollout_id']}: a model span is not an engine sample"


def check_rescore(rows: list[dict], tasks: dict[str, tuple]) -> None:
    for row in rows:
        task, verifier = tasks[row["task_id"]]
        score = verifier.score(task, row["completion"])
        assert row["error"] is None and score.error is None, row["rollout_id"]
        assert row["reward"] == score.reward, row["rollout_id"]
        assert {m["name"]: m["value"] for m in row["metrics"] if m["name"].startswith("reward/")} == {
            f"reward/{k}": v for k, v in score.components.items()}


def check_groups(rows: list[dict], n: int) -> None:
    groups = defaultdict(list)
    for row in rows:
        groups[row["group"]].append(row)
    for key, members in groups.items():
        assert sorted(r["sample"] for r in members) == list(range(n)), key
        assert len({r["task_id"] for r in members}) == 1 and key == f"{members[0]['run_id']}-{members[0]['task_id']}"


# ---------------------------------------------------------------- every env kind, unconstrained

@pytest.fixture(scope="module")
def mixed(engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed")
    return (*run(engine, out, ALL_ENVS, n=2, limit=2, max_tokens=16), out)


def test_every_builtin_env_kind_makes_valid_shards(mixed, renderer):
    summary, rows, sampled, out = mixed

    assert summary.written == len(rows) == 2 * 2 * len(ALL_ENVS) and summary.skipped == 0
    assert Counter(r["env"] for r in rows) == {env: 4 for env in KINDS}
    assert {r["env"]: r["interaction"]["kind"] for r in rows} == KINDS
    for row in rows:
        check_token_record(row, sampled)
        assert row["tokens_consistent"] and row["error"] is None
        assert row["provenance"]["engine"] == "vllm" and row["provenance"]["engine_version"]
        assert row["provenance"]["chat_template_sha256"] == renderer.template_sha256
    # Every model token the engine sampled is stored once, with mask 1.
    assert sum(sum(r["completion_mask"]) for r in rows) == sum(map(len, sampled)) == summary.generated_tokens
    manifest = json.loads((out / "manifest-w000of001.json").read_text())
    assert manifest["rows"] == len(rows) and manifest["shards"] == [p.name for p in summary.shards]
    assert set(manifest["envs"]) == set(KINDS)


def test_real_shards_load_with_datasets_and_polars(mixed, tmp_path):
    import datasets

    from hubgym.hub.rollout_stats import scan_rollouts, summarize

    _, rows, _, out = mixed
    files = [str(p) for p in shard_files([out])]
    streamed = datasets.load_dataset("arrow", data_files=files, split="train", streaming=True,
                                     cache_dir=str(tmp_path / "cache"))
    table = summarize(scan_rollouts([out]))

    assert sorted(r["rollout_id"] for r in streamed) == sorted(r["rollout_id"] for r in rows)
    assert table["env"].to_list() == sorted(KINDS) and table["rollouts"].to_list() == [4] * len(KINDS)
    assert table["groups"].to_list() == [2] * len(KINDS) and table["n"].to_list() == [2] * len(KINDS)


def test_prompt_ids_are_the_rendered_prompt(mixed, renderer):
    from hubgym.tools.registry import make_toolbox

    _, rows, _, _ = mixed
    tasks = tasks_by_id(ALL_ENVS, 2)
    for row in rows:
        task = tasks[row["task_id"]][0]
        tools = make_toolbox(task["interaction"]["tools"], task).schemas() if task["interaction"]["tools"] else None
        assert text(renderer, row["prompt_ids"]) == renderer.render(row["prompt"], tools, add_generation_prompt=True)


def test_stored_rewards_equal_a_fresh_rescore_and_groups_are_whole(mixed):
    _, rows, _, _ = mixed

    check_rescore(rows, tasks_by_id(ALL_ENVS, 2))
    check_groups(rows, 2)


def test_max_tokens_truncation_is_recorded_per_turn(mixed):
    _, rows, _, _ = mixed
    cut = [r for r in rows if r["finish_reason"] == "length"]

    assert len(cut) >= len(rows) // 2  # a random model rarely ends a reply within 16 tokens
    for row in cut:
        assert row["truncated"] and row["num_turns"] == 1
        assert row["completion_mask"] == [1] * 16
    for row in rows:
        assert row["truncated"] == (row["finish_reason"] != "stop")


# ---------------------------------------------------------------- multi_turn: env observations

def move_or_guess(request: Request) -> str:
    system = request.messages[0]["content"] or ""
    return r"<move>[1-9]</move>" if "<move>" in system else r"<guess>[a-z]{5}</guess>"


@pytest.fixture(scope="module")
def games(engine, tmp_path_factory):
    return run(engine, tmp_path_factory.mktemp("games"), ["wordle", "tictactoe"], move_or_guess, max_tokens=24)


def test_multi_turn_observations_are_tokens_with_mask_zero(games, renderer):
    summary, rows, sampled = games

    assert summary.written == 8
    assert max(r["num_turns"] for r in rows) >= 3
    for row in rows:
        check_token_record(row, sampled)
        assert row["tokens_consistent"]
        observations = [m["content"] for m in row["completion"] if m["role"] == "user"]
        assert [m["role"] for m in row["completion"]] == ["assistant", "user"] * row["num_turns"]
        bridges = spans(row, 0)
        # After each turn but the last, the observation comes back to the model as mask-0 tokens.
        assert len(bridges) == row["num_turns"] - 1
        for bridge, observation in zip(bridges, observations):
            assert f"<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n" in text(renderer, bridge)
        # The one token sequence is the chat rendering of the conversation up to the last reply.
        whole = text(renderer, row["prompt_ids"] + row["completion_ids"])
        shown = row["prompt"] + row["completion"][:-1]
        assert whole + "\n" == renderer.render(shown, None, add_generation_prompt=False)


def test_multi_turn_rewards_equal_a_fresh_rescore(games):
    _, rows, _ = games

    check_rescore(rows, tasks_by_id(["wordle", "tictactoe"], 2))
    check_groups(rows, 2)
    for row in rows:
        assert row["finish_reason"] in ("stop", "max_turns")  # the env ended the game, or the turns ran out
        assert row["truncated"] == (row["finish_reason"] == "max_turns")
        assert any(m["name"] == "reward/steps" for m in row["metrics"])


# ---------------------------------------------------------------- tool_use: forced tool calls

@pytest.fixture(scope="module")
def tool_run(engine, tmp_path_factory):
    tasks = tasks_by_id(["calc_tools", "retail"], 2)
    answers = {t["prompt"][-1]["content"]: t["info"]["answer"] for t, _ in tasks.values() if t["env"] == "calc_tools"}

    def constrain(request: Request) -> str:
        question = next(m["content"] for m in request.messages if m["role"] == "user")
        turn = sum(m["role"] == "assistant" for m in request.messages)
        if question not in answers:  # retail: look the customer up, then reply
            user_id = re.search(r"user id (\w+)", question).group(1)
            return call_regex("get_user", literal(f'{{"user_id": "{user_id}"}}')) if turn == 0 else "Done\\."
        if turn == 0:  # malformed: one closing brace short
            return literal('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}\n</tool_call>')
        if turn == 1:  # two parallel calls
            one = call_regex("calculator", literal('{"expression": "') + "[1-9]" + literal(' * 3"}'))
            return one + r"\n" + one
        return literal(f"<answer>{answers[question]}</answer>")

    # A forced reply may be spelled with short tokens (the random model picks any the regex allows): room for that.
    return (*run(engine, tmp_path_factory.mktemp("tools"), ["calc_tools", "retail"], constrain, max_tokens=192), tasks)


def test_forced_tool_calls_run_and_come_back_with_mask_zero(tool_run, renderer):
    _, rows, sampled, _ = tool_run
    calc = [r for r in rows if r["env"] == "calc_tools"]

    assert len(calc) == 4
    for row in calc:
        check_token_record(row, sampled)
        roles = [m["role"] for m in row["completion"]]
        assert roles == ["assistant", "tool", "assistant", "tool", "tool", "assistant"]
        invalid, first, second = (row["completion"][i] for i in (1, 3, 4))
        assert invalid["content"].startswith("Error: InvalidToolCall") and invalid["name"] == "invalid_tool_call"
        assert row["completion"][2]["tool_calls"][1]["id"] == "call-1-1"
        bridges = [text(renderer, b) for b in spans(row, 0)]
        assert len(bridges) == 2
        assert f"<tool_response>\n{invalid['content']}\n</tool_response>" in bridges[0]
        assert (f"<tool_response>\n{first['content']}\n</tool_response>\n"
                f"<tool_response>\n{second['content']}\n</tool_response>") in bridges[1]
        assert int(first["content"]) % 3 == 0 and int(second["content"]) % 3 == 0
        metrics = {m["name"]: m["value"] for m in row["metrics"]}
        assert (metrics["loop/tool_calls"], metrics["loop/tool_errors"], metrics["loop/parse_errors"]) == (3, 1, 1)
        assert metrics["reward/tool_calls"] == pytest.approx(0.2) and metrics["reward/correct"] == 1.0
        assert row["reward"] == pytest.approx(1.2) and metrics["success"] == 1.0
        assert row["finish_reason"] == "stop" and not row["truncated"] and row["num_turns"] == 3


def test_forced_retail_lookup_returns_the_customer_record(tool_run, renderer):
    _, rows, sampled, tasks = tool_run
    retail = [r for r in rows if r["env"] == "retail"]

    assert len(retail) == 4
    check_rescore(rows, tasks)
    for row in retail:
        check_token_record(row, sampled)
        lookup = row["completion"][1]
        assert [m["role"] for m in row["completion"]] == ["assistant", "tool", "assistant"]
        assert lookup["name"] == "get_user" and not lookup["content"].startswith("Error")
        assert json.loads(row["completion"][0]["tool_calls"][0]["arguments"])["user_id"] in lookup["content"]
        assert f"<tool_response>\n{lookup['content']}\n</tool_response>" in text(renderer, spans(row, 0)[0])
        assert row["completion"][2]["content"] == "Done."


# ---------------------------------------------------------------- truncation by turns and by context

def test_max_turns_truncation(engine, tmp_path):
    always_call = call_regex("calculator", literal('{"expression": "2 + 2"}'))
    _, rows, sampled = run(engine, tmp_path, ["calc_tools"], lambda request: always_call, limit=1,
                                 max_tokens=96)

    assert len(rows) == 2
    for row in rows:
        check_token_record(row, sampled)
        assert (row["finish_reason"], row["truncated"], row["num_turns"]) == ("max_turns", True, 4)
        assert [m["role"] for m in row["completion"]] == ["assistant", "tool"] * 4
        assert len(spans(row, 0)) == 3  # no tokens after the last turn: nothing more is generated
        assert row["reward"] == pytest.approx(0.2)  # shaping pays for 2 calls at most


def test_context_length_truncation(engine, renderer, tmp_path):
    wordle, arithmetic = (open_env(env).take("test", 1)[0] for env in ("wordle", "arithmetic:easy"))
    game_limit = len(renderer.prompt_ids(wordle["prompt"], None)) + 24
    reply_limit = len(renderer.prompt_ids(arithmetic["prompt"], None)) + 8
    _, game, sampled = run(engine, tmp_path / "game", ["wordle"], move_or_guess, limit=1, max_tokens=24,
                           max_model_len=game_limit)
    _, reply, _ = run(engine, tmp_path / "reply", ["arithmetic:easy"], limit=1, max_tokens=16,
                      max_model_len=reply_limit)
    _, over, _ = run(engine, tmp_path / "over", ["arithmetic:easy"], limit=1, max_model_len=40)

    for row in game:  # the observations fill the context after a turn or two
        check_token_record(row, sampled)
        assert (row["finish_reason"], row["truncated"]) == ("context_length", True)
        assert 1 <= row["num_turns"] <= 2
        assert len(row["prompt_ids"]) + sum(row["completion_mask"]) <= game_limit
    for row in reply:  # the context, not max_tokens, cut the reply: the row says which
        assert (row["finish_reason"], row["truncated"], row["num_turns"]) == ("context_length", True, 1)
        assert len(row["prompt_ids"]) + len(row["completion_ids"]) == reply_limit
    for row in over:  # the prompt alone is over the limit: nothing is generated, the row is still written
        assert (row["finish_reason"], row["truncated"], row["num_turns"]) == ("context_length", True, 0)
        assert row["completion_ids"] == [] and row["completion"] == [] and row["reward"] == 0.0


# ---------------------------------------------------------------- bad input and faults

def test_a_refused_request_and_an_empty_reply_are_recorded_and_the_run_goes_on(engine, tmp_path):
    tasks = open_env("arithmetic:easy").take("test", 4)
    refused, empty = tasks[1]["prompt"][-1]["content"], tasks[2]["prompt"][-1]["content"]

    def constrain(request: Request) -> str | None:
        question = request.messages[-1]["content"]
        return "(unclosed[" if question == refused else r"\s?" if question == empty else None

    summary, rows, _ = run(engine, tmp_path, ["arithmetic:easy"], constrain, limit=4)

    assert summary.written == len(rows) == 8
    by_task = defaultdict(list)
    for row in rows:
        by_task[row["task_id"]].append(row)
    for row in by_task[tasks[1]["id"]]:  # vLLM refused this request; the batch around it still ran
        assert row["error"]["boundary"] == "engine" and row["error"]["type"] == "RequestError"
        assert "invalid regex" in row["error"]["message"]
        assert row["reward"] is None and row["finish_reason"] == "error" and row["completion_ids"] == []
    for row in by_task[tasks[2]["id"]]:
        assert {m["name"]: m["value"] for m in row["metrics"]}["loop/empty_responses"] == 1
        assert row["completion"][0]["content"].strip() == "" and row["reward"] == 0.0
    assert sum(r["error"] is None for r in rows) == 6


def test_an_unknown_tool_is_refused_before_any_generation(engine, tmp_path):
    broken = str(BROKEN_ENVS / "unknown_tool")
    first_row = build_tasks(resolve_env(broken), "default")["test"][0]["id"]
    requests = engine.requests

    with pytest.raises(ToolNotFoundError) as raised:
        run(engine, tmp_path / "run", ["arithmetic:easy", broken])

    assert f"row={first_row!r}" in str(raised.value) and "field='interaction.tools'" in str(raised.value)
    assert "no tool named 'no_such_tool'" in str(raised.value)
    assert engine.requests == requests and not (tmp_path / "run").exists()


def test_an_env_whose_reset_fails_is_recorded_on_every_row_before_any_generation(engine, renderer):
    import types

    from hubgym.verifiers import wordle

    broken = types.ModuleType("broken_wordle")
    broken.REWARDS, broken.step, broken.__file__ = dict(wordle.REWARDS), wordle.step, wordle.__file__
    broken.reset = lambda task: (_ for _ in ()).throw(KeyError("secret"))
    task, requests = open_env("wordle").take("test", 1)[0], engine.requests
    ctx = LoopContext(engine, renderer, SamplingArgs(max_tokens=8), load_verifier(broken))

    trajectories = asyncio.run(run_group(task, 2, ctx))

    assert engine.requests == requests
    outcomes = [(t.finish_reason, t.error["boundary"], t.error["type"], t.num_turns) for t in trajectories]
    assert outcomes == [("error", "env", "KeyError", 0)] * 2


def test_a_template_that_rewrites_earlier_turns_is_flagged(engine, tiny_model):
    from transformers import AutoTokenizer

    tokenizer = copy.deepcopy(AutoTokenizer.from_pretrained(tiny_model))
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "{% if message.content %}{{ message.content }}{% endif -%}",
        "{% if message.content %}{{ message.content.split('</think>')[-1] if not loop.last else message.content }}"
        "{% endif -%}")
    task = open_env("wordle").take("test", 1)[0]
    verifier = load_verifier("hubgym.verifiers.wordle")
    ctx = LoopContext(engine, ChatRenderer(tokenizer), SamplingArgs(max_tokens=64), verifier)
    engine.constrain = lambda request: r"<think>[a-z]{2}</think><guess>[a-z]{5}</guess>"
    try:
        trajectories = asyncio.run(run_group(task, 2, ctx))
    finally:
        engine.constrain = None

    for traj in trajectories:
        record = traj.tokens
        assert traj.num_turns >= 2 and not record.consistent
        assert record.problems[0].startswith("turn 1: chat template is not prefix-consistent")
        assert len(record.completion_ids) == len(record.mask) == len(record.logprobs)
        for bridge in spans({"completion_ids": record.completion_ids, "completion_mask": record.mask}, 0):
            assert "<think>" not in text(ctx.renderer, bridge) and "<guess>" not in text(ctx.renderer, bridge)


# ---------------------------------------------------------------- resume and scale-out

def test_a_killed_run_resumes_with_no_duplicate_and_no_missing_rollout(killed_run, engine):
    returncode = killed_run.wait()
    config = killed_run.config
    stored = [i for p in shard_files([config.out])
              for i in pa.ipc.open_file(str(p)).read_all()["rollout_id"].to_pylist()]
    run_id = config.run_id()
    expected = {rollout_id(run_id, task_id, i) for task_id in tasks_by_id(config.envs, config.limit) for i in range(2)}

    assert returncode == -signal.SIGKILL, killed_run.log.read_text()[-3000:]
    assert killed_run.killed_at_shards and 0 < len(stored) < len(expected)

    engine.constrain = None
    summary = run_rollouts(config, engine=engine, progress=False)
    ids = [r["rollout_id"] for r in read_rows(Path(config.out))]

    assert len(ids) == len(set(ids)) and set(ids) == expected
    assert summary.skipped == len(stored) and summary.written == len(expected) - len(stored)
    manifest = json.loads((Path(config.out) / "manifest-w000of001.json").read_text())
    assert manifest["rows"] == len(expected) and len(manifest["shards"]) == len(expected) // 2
    again = run_rollouts(config, engine=engine, progress=False)
    assert (again.written, again.skipped) == (0, len(expected))

    class WouldStartAnEngine(Exception):
        pass

    def no_engine(config):
        raise WouldStartAnEngine
    with pytest.MonkeyPatch.context() as patch:  # the finished run run again: nothing to sample, no engine started
        patch.setattr("hubgym.rollout.run.engine_for", no_engine)
        finished = run_rollouts(config, progress=False)
        assert (finished.written, finished.skipped) == (0, len(expected))
        (Path(config.out) / "manifest-w000of001.json").unlink()  # its manifest lost: the engine starts to write it
        with pytest.raises(WouldStartAnEngine):
            run_rollouts(config, progress=False)
    assert run_rollouts(config, engine=engine, progress=False).written == 0
    assert json.loads((Path(config.out) / "manifest-w000of001.json").read_text())["rows"] == len(expected)


def test_two_workers_split_the_tasks_disjointly(engine, tmp_path):
    envs, both = ["arithmetic:easy", "reverse_text"], tmp_path / "two"
    requests = engine.requests
    _, one, sampled = run(engine, tmp_path / "one", envs, limit=6, max_tokens=6)
    assert engine.requests - requests == 12 and len(sampled) == 24  # a group is one request with n samples
    parts = [run(engine, both, envs, limit=6, max_tokens=6, shard_index=i, num_shards=2)[0] for i in range(2)]
    rows = read_rows(both)

    assert [p.name for p in parts[0].shards] == ["w000of002-00000.arrow"]
    assert [p.name for p in parts[1].shards] == ["w001of002-00000.arrow"]
    worker_tasks = [{r["task_id"] for p in part.shards for r in pa.ipc.open_file(str(p)).read_all().to_pylist()}
                    for part in parts]
    assert worker_tasks[0] and worker_tasks[1] and not worker_tasks[0] & worker_tasks[1]
    assert worker_tasks[0] | worker_tasks[1] == {r["task_id"] for r in one} and len(one) == 24
    assert len(rows) == len({r["rollout_id"] for r in rows}) == 24 and parts[0].run_id == parts[1].run_id
    # Per-request seeds: the same task and sample get the same tokens, however the batches were formed.
    tokens = {(r["task_id"], r["sample"]): r["completion_ids"] for r in one}
    assert {(r["task_id"], r["sample"]): r["completion_ids"] for r in rows} == tokens
