"""The agent loop: drive one task's group of trajectories through an engine, tools and the env.

The interaction spec of each row picks the loop: single_turn (one reply), tool_use (tool calls
until an answer or `max_turns`), multi_turn (the verifier's `reset`/`step` MDP). Tools may be
offered in any kind. The first turn of a group is one request with `n` samples; the samples
then continue as independent trajectories. A failure is recorded on its trajectory (a bad
rollout is data, not a crash); only an engine that fails for everyone stops the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from hubgym.engines import Engine, Request, RequestError, Sample, SamplingArgs
from hubgym.rollout.parsing import ReplyParser
from hubgym.rollout.tokens import ChatRenderer, TokenRecord
from hubgym.schemas.messages import Message, ToolCall, assistant, tool_result, user, TOOL_ERROR_PREFIX
from hubgym.schemas.rollouts import RowError
from hubgym.schemas.tasks import Task
from hubgym.tools.base import Toolbox
from hubgym.tools.registry import make_toolbox
from hubgym.verifiers.contract import Verifier


_DEFAULT_PARSER = ReplyParser(None)  # chat-mode engines without a local tokenizer: Hermes text, no reasoning


@dataclass
class Trajectory:
    task: Task
    sample: int
    prompt: list[Message]
    tokens: TokenRecord
    toolbox: Toolbox | None
    state: Any = None  # multi_turn env state
    completion: list[Message] = field(default_factory=list)
    finish_reason: str = ""
    truncated: bool = False
    done: bool = False
    num_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    parse_errors: int = 0
    empty_responses: int = 0
    error: RowError | None = None
    step_rewards: list[float] = field(default_factory=list)  # multi_turn: the reward of each env step
    generate_s: float = 0.0
    tools_s: float = 0.0


@dataclass(frozen=True)
class LoopContext:
    engine: Engine
    renderer: ChatRenderer | None  # None only for chat-mode engines without a local tokenizer
    sampling: SamplingArgs
    verifier: Verifier
    max_model_len: int | None = None  # the run's context limit (tokens); the engine's own limit applies too


def request_seed(base: int, task_id: str, sample: int, turn: int) -> int:
    """A per-request seed: the same run seed gives the same samples, whatever the batch order."""
    return int.from_bytes(hashlib.sha256(f"{base}:{task_id}:{sample}:{turn}".encode()).digest()[:4], "big") >> 1


async def run_group(task: Task, n: int, ctx: LoopContext) -> list[Trajectory]:
    """Sample `n` trajectories for one task (one GRPO group)."""
    spec = task["interaction"]
    state, prompt, failed = None, list(task["prompt"]), None
    if spec["kind"] == "multi_turn":
        try:
            state, observation = ctx.verifier.reset(task)
            prompt += [user(observation)] if observation else []
        except Exception as exc:  # the env failed before any generation: recorded on every row of the group
            failed = {"boundary": "env", "type": type(exc).__name__, "message": str(exc)[:2000]}
    toolboxes = [make_toolbox(spec["tools"], task, ctx.verifier.tools) if spec["tools"] else None for _ in range(n)]
    tools = toolboxes[0].schemas() if toolboxes[0] else None
    prompt_ids = ctx.renderer.prompt_ids(prompt, tools) if ctx.engine.token_in else []
    trajs = [Trajectory(task, i, prompt, TokenRecord(list(prompt_ids)), toolboxes[i], state) for i in range(n)]
    if failed:
        for t in trajs:
            t.done, t.finish_reason, t.error = True, "error", failed
        return trajs
    first = await _generate(trajs[0], ctx, tools, n, trajs)
    await asyncio.gather(*(_continue(t, s, ctx, tools) for t, s in zip(trajs, first)))
    return trajs


async def _continue(traj: Trajectory, sample: Sample | None, ctx: LoopContext, tools: list[dict] | None) -> None:
    while sample is not None:
        await _take_turn(traj, sample, ctx, tools)
        sample = None if traj.done else (await _generate(traj, ctx, tools, 1, [traj]))[0]


async def _generate(traj: Trajectory, ctx: LoopContext, tools, n: int, group: list[Trajectory]) -> list[Sample | None]:
    """One request; on a request-level failure every trajectory in `group` records it and stops."""
    spec = traj.task["interaction"]
    limit = min(ctx.engine.max_model_len, ctx.max_model_len or ctx.engine.max_model_len)
    room = limit - len(traj.tokens.sequence())
    wanted = spec["max_tokens"] or ctx.sampling.max_tokens
    budget = min(wanted, room)
    if budget <= 0:
        for t in group:
            t.done, t.truncated, t.finish_reason = True, True, "context_length"
        return [None] * n
    request = Request(traj.tokens.sequence(), traj.prompt + traj.completion, tools, n, budget,
                      request_seed(ctx.sampling.seed, traj.task["id"], traj.sample, traj.num_turns))
    started = time.perf_counter()
    try:
        samples = await ctx.engine.generate(request, ctx.sampling)
    except RequestError as exc:
        for t in group:
            t.done, t.finish_reason = True, "error"
            t.error = {"boundary": "engine", "type": "RequestError", "message": str(exc)[:2000]}
        return [None] * n
    for t in group:
        t.generate_s += time.perf_counter() - started
    if budget < wanted:  # the context, not max_tokens, bounded this turn: say which limit cut it
        for s in samples:
            s.finish_reason = "context_length" if s.finish_reason == "length" else s.finish_reason
    return samples


async def _take_turn(traj: Trajectory, sample: Sample, ctx: LoopContext, tools: list[dict] | None) -> None:
    spec, history = traj.task["interaction"], traj.prompt + traj.completion
    _record_model_tokens(traj, sample, ctx)
    reply, calls = _reply(traj, sample, ctx.renderer, tools)
    traj.completion.append(reply)
    traj.num_turns += 1
    traj.finish_reason = sample.finish_reason
    new: list[Message] = []
    if sample.finish_reason in ("length", "context_length"):
        traj.done = traj.truncated = True
    elif calls:
        new = await _run_tools(traj, calls)
    elif spec["kind"] == "multi_turn":
        new = _env_step(traj, ctx, reply["content"] or "")
    else:
        traj.done = True
    traj.completion += new
    if not traj.done and traj.num_turns >= spec["max_turns"]:
        traj.done, traj.truncated, traj.finish_reason = True, True, "max_turns"
    if not traj.done and ctx.engine.token_in:
        ended = sample.finish_reason == "stop" and ctx.renderer.ends_turn(sample.token_ids)
        ids, problem = ctx.renderer.bridge(history, reply, new, tools, ended)
        traj.tokens.add_env(ids)
        if problem:
            traj.tokens.mark_inconsistent(f"turn {traj.num_turns}: {problem}")


def _record_model_tokens(traj: Trajectory, sample: Sample, ctx: LoopContext) -> None:
    record = traj.tokens
    if not ctx.engine.token_in:  # chat mode: the server rendered the prompt; it must extend what we have
        if not record.prompt_ids:
            record.prompt_ids = list(sample.prompt_ids)
        elif sample.prompt_ids[: len(record.sequence())] == record.sequence():
            record.add_env(sample.prompt_ids[len(record.sequence()):])
        else:
            # Keep the model's tokens (they are real samples) but flag that the context between turns differs.
            record.mark_inconsistent(f"turn {traj.num_turns + 1}: "
                                     "the server's prompt does not extend the stored tokens")
    if len(sample.token_ids) != len(sample.logprobs):
        record.mark_inconsistent(f"turn {traj.num_turns + 1}: engine returned no logprobs for some tokens")
        record.add_model(sample.token_ids, [0.0] * len(sample.token_ids))
        return
    record.add_model(sample.token_ids, sample.logprobs)


def _reply(traj: Trajectory, sample: Sample, renderer: ChatRenderer | None,
           tools: list[dict] | None) -> tuple[Message, list[ToolCall]]:
    """The assistant message and its tool calls: native ones (chat mode), else read from the text by the
    renderer's parser (reasoning split off, tool calls parsed when tools are offered). Call ids are
    `call-<turn>-<n>`, so a replay reads a stored reply to the same ids."""
    if sample.tool_calls is not None:
        calls, text, reasoning = sample.tool_calls, sample.text, None
    else:
        parser = renderer.parser if renderer is not None else _DEFAULT_PARSER
        parsed = parser.parse(sample.text, f"call-{traj.num_turns}", tools if traj.toolbox is not None else None)
        calls, text, reasoning = parsed.calls, parsed.content, parsed.reasoning
        traj.parse_errors += len(parsed.parse_errors)
    if not text.strip() and not calls:
        traj.empty_responses += 1
    return assistant(text, calls or None, reasoning=reasoning), calls


async def _run_tools(traj: Trajectory, calls: list[ToolCall]) -> list[Message]:
    """Run the calls of one turn in order (stateful tools stay deterministic); errors go back to the model."""
    started, messages = time.perf_counter(), []
    for call in calls:
        traj.tool_calls += 1
        if call["name"] == "invalid_tool_call":
            traj.tool_errors += 1
            messages.append(tool_result(f"{TOOL_ERROR_PREFIX}InvalidToolCall: the tool call is not valid JSON with "
                                        f"'name' and 'arguments': {call['arguments'][:200]}", call["id"], call["name"]))
            continue
        if traj.toolbox is None:
            traj.tool_errors += 1
            messages.append(tool_result(f"{TOOL_ERROR_PREFIX}UnknownTool: no tools are offered in this task",
                                        call["id"], call["name"]))
            continue
        outcome = await asyncio.to_thread(traj.toolbox.call, call)
        traj.tool_errors += outcome.error is not None
        messages.append(outcome.message)
    traj.tools_s += time.perf_counter() - started
    return messages


def _env_step(traj: Trajectory, ctx: LoopContext, action: str) -> list[Message]:
    try:
        traj.state, observation, reward, done = ctx.verifier.step(traj.task, traj.state, action)
    except Exception as exc:  # the env failed: recorded, this trajectory stops
        traj.error = {"boundary": "env", "type": type(exc).__name__, "message": str(exc)[:2000]}
        traj.done, traj.finish_reason = True, "error"
        return []
    traj.done = bool(done)
    traj.step_rewards.append(float(reward))
    return [user(observation)] if observation else []
