"""One TRL generation batch as hubgym rollout rows: what `TRLRecorder` stores (hubgym.integrations.trl_record).

A row holds what TRL generated, as it generated it: the prompt ids it rendered (tools included), the completion ids
of every turn with TRL's tool mask (1 = sampled by the model, 0 = tool results and the env's observations, which
TRL tokenizes between turns), the sampling logprobs (0.0 at mask 0; empty where TRL's generation kept none, with
metric `trl/sampling_logprobs` = 0), the messages TRL parsed, and the score TRL trained on (hubgym's verifier, read
from TRL's completion: `hubgym score` of the stored row gives it again). A multi_turn task's interaction names the
tool `act` it was played through (hubgym.verifiers.act), and the tool schemas TRL rendered are recorded in the
provenance's sampling JSON, so `hubgym replay` audits the tokens against the same rendering.

Ids: the group is `<run>-s<step>g<k>-<task>` (TRL's global step when the batch was generated, k counting batches
generated at that step), samples numbered in TRL's order; the rollout id is `<group>-<sample>`.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from hubgym.integrations.trl_messages import TASK_COLUMN, from_trl_completion, played_through_act
from hubgym.schemas.messages import Message, message
from hubgym.schemas.rollouts import Rollout
from hubgym.schemas.version import SCHEMA_VERSION
from hubgym.verifiers.act import driven_by_act, play
from hubgym.verifiers.contract import Score, Verifier

ENGINE = "trl"


@dataclass
class GenerationBatch:
    """What one call of GRPOTrainer._generate_and_score_completions made, per row in TRL's order."""

    step: int  # TRL's global step when it generated (the weights that sampled): the rows' policy_version
    index: int  # batches generated at this step before this one
    inputs: list[dict[str, Any]]  # the dataset rows (`prompt`, `hubgym_task`)
    prompts: list[Any]  # the prompts TRL generated from
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    tool_mask: list[list[int]] | None  # None when TRL ran no tools
    completions: list[Any]  # TRL's parsed completions (conversational: lists of messages)
    logprobs: list[list[float] | None]  # per row; None where TRL kept none and none could be read
    scores: list[Score]
    seconds: float  # generation and scoring, for the batch


@dataclass
class RunContext:
    """What every row of a recorded run shares."""

    run_id: str
    env: Any  # the TRLEnv
    model: str
    sampling: dict[str, Any]  # recorded on every row (JSON) and in the manifest
    engine_version: str
    stop_ids: frozenset[int]
    tool_schemas: list[dict] | None
    renderer: Any = None  # a ChatRenderer for the token audit (None: not audited)
    max_tool_iterations: int = 1

    @property
    def sampling_json(self) -> str:
        """The sampling JSON of every row: keys in the order given (not sorted), since the tool schemas in it are
        rendered into prompts key by key, and a replay must render them as TRL did."""
        return json.dumps(self.sampling, default=str)

    @property
    def verifier(self) -> Verifier:
        return self.env.verifier


def batch_rows(batch: GenerationBatch, ctx: RunContext) -> list[Rollout]:
    """The batch's rows, grouped as TRL grouped them (a task's samples of one batch are one GRPO group)."""
    samples: dict[str, int] = {}
    rows = []
    for i, inp in enumerate(batch.inputs):
        task = played_through_act(json.loads(inp[TASK_COLUMN]))
        group = f"{ctx.run_id}-s{batch.step}g{batch.index}-{task['id']}"
        sample = samples.get(group, 0)
        samples[group] = sample + 1
        rows.append(_row(batch, i, task, group, sample, ctx))
    return rows


def _row(batch: GenerationBatch, i: int, task: dict[str, Any], group: str, sample: int, ctx: RunContext) -> Rollout:
    """One row; `tokens_consistent` is left True for the writer's token audit (hubgym.integrations.trl_writer)."""
    ids = list(batch.completion_ids[i])
    mask = list(batch.tool_mask[i])[:len(ids)] if batch.tool_mask is not None else [1] * len(ids)
    logprobs = batch.logprobs[i]
    completion = from_trl_completion(batch.completions[i])
    score = batch.scores[i]
    steps, env_error = episode_of(ctx.verifier, task, completion)
    error = env_error or score.error
    finish, truncated = finish_of(completion, ids, mask, ctx)
    share = batch.seconds / max(len(batch.inputs), 1)
    row: Rollout = {
        "rollout_id": f"{group}-{sample}", "run_id": ctx.run_id, "task_id": task["id"], "env": task["env"],
        "group": group, "sample": sample, "prompt": [_message(m) for m in batch.prompts[i]],
        "completion": completion, "info": task["info"], "interaction": task["interaction"],
        "prompt_ids": list(batch.prompt_ids[i]), "completion_ids": ids, "completion_mask": mask,
        "completion_logprobs": list(logprobs) if logprobs is not None else [], "tokens_consistent": True,
        "reward": score.reward if error is None else None,
        "metrics": _metrics(score, error, steps, completion, logprobs is not None, ctx.verifier),
        "finish_reason": finish, "truncated": truncated,
        "num_turns": sum(1 for m in completion if m["role"] == "assistant"), "error": error,
        "provenance": {
            "model": ctx.model, "policy_version": batch.step, "sampling": ctx.sampling_json,
            "env_repo": ctx.env.provenance.get("env_repo"), "env_revision": ctx.env.provenance.get("env_revision"),
            "verifier_module": ctx.verifier.name, "verifier_sha256": ctx.verifier.sha256, "engine": ENGINE,
            "engine_version": ctx.engine_version + ("" if logprobs is not None else "; no sampling logprobs"),
            "chat_template_sha256": ctx.renderer.template_sha256 if ctx.renderer is not None else None,
            "env_code_sha256": ctx.verifier.code_sha256 or None,
        },
        "timings": {"generate_s": share, "tools_s": None, "score_s": None, "total_s": share},
        "created_at": dt.datetime.now(dt.timezone.utc),
    }
    return row


def episode_of(verifier: Verifier, task: dict[str, Any], completion: list[Message]) -> tuple[list[float], dict | None]:
    """(each step's reward, the env error) of a multi_turn episode, read from the completion as a re-score and a
    replay read it (hubgym.verifiers.act.play): a step whose result TRL dropped from the completion is not one."""
    if not driven_by_act(task["interaction"]):
        return [], None
    _, episode, exc = play(verifier, task, completion)
    error = None if exc is None else {"boundary": "env", "type": type(exc).__name__, "message": str(exc)[:2000]}
    return episode.rewards, error


def _message(m: Any) -> Message:
    if isinstance(m, str):
        return message("user", m)
    content = m.get("content")
    if isinstance(content, list):  # content parts: text only
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return message(m["role"], content)


def finish_of(completion: list[Message], ids: list[int], mask: list[int], ctx: RunContext) -> tuple[str, bool]:
    """(finish_reason, truncated): `stop` when the model's last turn ended on a stop token and asked for nothing
    more; a last turn whose tool calls TRL did not run is cut: `max_turns` when TRL's tool loop had made its
    `max_tool_calling_iterations` turns, else `length` (the result would not fit `max_completion_length`), as is
    a reply cut by that limit."""
    last = completion[-1] if completion else None
    sampled = [t for t, m in zip(ids, mask) if m]
    ended = last is not None and last["role"] == "assistant" and bool(sampled) and sampled[-1] in ctx.stop_ids
    if ended and last.get("tool_calls"):
        turns = sum(1 for m in completion if m["role"] == "assistant")
        return ("max_turns" if turns > ctx.max_tool_iterations else "length"), True
    return ("stop", False) if ended else ("length", True)


def _metrics(score: Score, error: dict | None, steps: list[float], completion: list[Message], logprobs: bool,
             verifier: Verifier) -> list[dict[str, Any]]:
    out = {f"reward/{k}": float(v) for k, v in score.components.items()}
    out["success"] = float(error is None and verifier.succeeded(score))
    calls = [c for m in completion if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    results = [m for m in completion if m["role"] == "tool"]
    out["loop/tool_calls"] = float(len(calls))
    out["loop/tool_errors"] = float(sum(_failed(m["content"]) for m in results))
    out["loop/empty_responses"] = float(sum(1 for m in completion if m["role"] == "assistant"
                                           and not (m["content"] or "").strip() and not m.get("tool_calls")))
    out["trl/sampling_logprobs"] = float(logprobs)
    out.update({f"step/{k}/reward": float(r) for k, r in enumerate(steps)})  # for replay
    return [{"name": k, "value": v} for k, v in out.items()]


def _failed(content: str | None) -> bool:
    """A tool result reporting a failure: hubgym's `Error: ...`, or TRL's `{'error': ...}` for a call it refused."""
    text = content or ""
    return text.startswith("Error: ") or text.startswith("{'error'")


def manifest_fields(ctx: RunContext) -> dict[str, Any]:
    """The run manifest's fields every write shares, as `hubgym rollout` writes them, plus where the run came from
    (the writer adds its worker, shards, rows, policy version and time: hubgym.integrations.trl_writer)."""
    env = ctx.env
    return {
        "schema_version": SCHEMA_VERSION, "run_id": ctx.run_id, "model": ctx.model, "sampling": ctx.sampling,
        "engine": ENGINE, "engine_version": ctx.engine_version,
        "chat_template_sha256": ctx.renderer.template_sha256 if ctx.renderer is not None else None,
        "envs": {env.env: {**env.provenance, "config": env.config, "tasks": len(env.tasks)}}, "split": env.split,
        "n": ctx.sampling.get("n"), "recorded_from": "trl",
    }
