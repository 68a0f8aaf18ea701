"""Replay stored rollouts: re-run multi_turn dynamics from the stored actions, and audit the tokens.

    report = replay("runs/r1", model="model_dir")        # every row of every shard (or a hub ref, or rows)
    report.diverged                                       # ReplayResult of each row whose dynamics did not reproduce
    replay_rollout(row, verifier).divergence              # one row: Divergence(turn=2, field="observation", ...)
    audit_tokens(row, tokenizer).index                    # first stored token the chat template does not produce

Dynamics: the verifier's pure `reset`/`step` run on the stored actions (the assistant turns that
are not tool calls; for a row played through the tool `act`, TRL's environment interface, each call
of `act` under the tool's rules), exactly as the rollout loop stepped them. The reset observation, every
observation, every per-step reward (`step/<i>/reward` metrics), where the episode ended and the
turn count must come out the same; the first difference is reported with its turn (1 = after the
first assistant turn, 0 = the reset) and field. Tool results are not re-run (re-scoring covers them).

Tokens: the chat template is applied again to the stored messages; the stored `prompt_ids +
completion_ids`, decoded, must read as that rendering. A template that rewrites earlier turns
(Qwen3-style removal of past reasoning, say) fails here, with the first stored token it does not
produce, the turn that token belongs to and the text around it on both sides. The audit is the
rollout writer's own check (`hubgym.rollout.tokens.audit_tokens`): a row stored with
`tokens_consistent` true passes it, one stored false fails it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from hubgym.errors import RolloutNotFoundError, VerifierLoadError, Where
from hubgym.rollout.tokens import ChatRenderer, TokenAudit
from hubgym.rollout.tokens import audit_tokens as audit_row
from hubgym.score.choice import VerifierArg, VerifierChoice, load_verifier_of
from hubgym.verifiers.act import ACT_TOOL, ActEpisode, act_action, driven_by_act
from hubgym.verifiers.contract import CUT_FINISHES, Verifier, last_reply_cut, stored_step_rewards


@dataclass(frozen=True)
class Divergence:
    """The first place where replaying a row's actions disagrees with what the row stores."""

    turn: int  # assistant turn after which it shows (1-based; 0 = the reset observation)
    field: str  # observation | reward | done | num_turns | error
    stored: Any
    replayed: Any

    def __str__(self) -> str:
        return f"turn {self.turn} {self.field}: stored {self.stored!r}, replayed {self.replayed!r}"


@dataclass
class ReplayResult:
    rollout_id: str
    env: str
    kind: str  # the row's interaction kind; only multi_turn rows have dynamics to replay
    steps: int = 0  # env steps replayed
    divergence: Divergence | None = None
    audit: TokenAudit | None = None  # None when no tokenizer was given
    verifier_changed: bool = False  # the verifier's sha256 differs from the one in the row's provenance

    @property
    def replayed(self) -> bool:
        return self.kind == "multi_turn"

    @property
    def ok(self) -> bool:
        return self.divergence is None and (self.audit is None or self.audit.ok)


@dataclass
class ReplayReport:
    results: list[ReplayResult] = field(default_factory=list)

    @property
    def diverged(self) -> list[ReplayResult]:
        return [r for r in self.results if r.divergence is not None]

    @property
    def token_failures(self) -> list[ReplayResult]:
        return [r for r in self.results if r.audit is not None and not r.audit.ok]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def counts(self, env: str | None = None) -> dict[str, int]:
        rows = [r for r in self.results if env is None or r.env == env]
        return {"rollouts": len(rows), "replayed": sum(r.replayed for r in rows),
                "reproduced": sum(r.replayed and r.divergence is None for r in rows),
                "diverged": sum(r.divergence is not None for r in rows),
                "token_audited": sum(r.audit is not None for r in rows),
                "token_audit_failures": sum(r.audit is not None and not r.audit.ok for r in rows)}


# ---- dynamics ---------------------------------------------------------------------------------------------------


def replay_rollout(row: dict[str, Any], verifier: Verifier, renderer: Any = None) -> ReplayResult:
    """Replay one row's multi_turn dynamics (and audit its tokens when a tokenizer or renderer is given)."""
    result = ReplayResult(row["rollout_id"], row["env"], row["interaction"]["kind"])
    result.verifier_changed = (row.get("provenance") or {}).get("verifier_sha256") not in (None, verifier.sha256)
    if result.replayed:
        if not verifier.multi_turn:
            raise VerifierLoadError(f"the row is multi_turn but verifier {verifier.name!r} has no reset/step",
                                    Where(env=row["env"], row=row["rollout_id"], field="interaction.kind"),
                                    "replay it with the env's own verifier (leave out --verifier, or name that one)")
        result.divergence, result.steps = replay_dynamics(row, verifier)
    if renderer is not None:
        result.audit = audit_tokens(row, renderer, verifier.tools)
    return result


def replay_dynamics(row: dict[str, Any], verifier: Verifier) -> tuple[Divergence | None, int]:
    """(the first divergence or None, env steps replayed), stepping the actions the way the loop did."""
    completion = row["completion"]
    turns = [i for i, m in enumerate(completion) if m["role"] == "assistant"]
    if row["num_turns"] != len(turns):
        return Divergence(len(turns), "num_turns", row["num_turns"], len(turns)), 0
    if driven_by_act(row["interaction"]):
        return replay_act_dynamics(row, verifier)
    rewards = stored_step_rewards(row.get("metrics"))
    failed = row["error"] if (row.get("error") or {}).get("boundary") == "env" else None
    try:
        task, state, observation, stored = _reset(row, verifier)
    except Exception as exc:  # reset raised: only a row that recorded the same env error reproduces
        return _raised(0, failed, exc), 0
    if stored != (observation or None):
        return Divergence(0, "observation", stored, observation), 0
    actions = [(n, i) for n, i in enumerate(turns, 1) if not completion[i].get("tool_calls")]
    if actions and last_reply_cut(completion, row["finish_reason"], None if rewards is None else len(rewards)):
        actions = actions[:-1]
    done = False
    for k, (turn, i) in enumerate(actions):
        if done:  # the env had ended the episode, yet the row goes on
            return Divergence(actions[k - 1][0], "done", False, True), k
        try:
            state, observation, reward, done = verifier.step(task, state, completion[i]["content"] or "")
        except Exception as exc:  # reproduces only as the row's own env error, on its last action
            return _raised(turn, failed if k == len(actions) - 1 else None, exc), k
        following = completion[i + 1] if i + 1 < len(completion) else None
        stored = following["content"] if following and following["role"] == "user" else None
        if stored != (observation or None):
            return Divergence(turn, "observation", stored, observation or None), k + 1
        if rewards is not None and not _same(rewards.get(k), reward):
            return Divergence(turn, "reward", rewards.get(k), float(reward)), k + 1
    last = actions[-1][0] if actions else 0
    if failed:  # the row says the env raised, but every step ran
        return Divergence(last, "error", f"{failed['type']}: {failed['message']}", None), len(actions)
    if rewards is not None and len(rewards) > len(actions):
        extra = min(set(rewards) - set(range(len(actions))))
        return Divergence(last + 1, "reward", rewards[extra], None), len(actions)
    stopped = (row.get("error") or {}).get("boundary") not in (None, "verifier")  # a failure ended it early
    if not done and not row["truncated"] and not stopped and row["finish_reason"] not in CUT_FINISHES:
        return Divergence(last, "done", True, False), len(actions)  # stored as finished; the env had not ended it
    return None, len(actions)


def replay_act_dynamics(row: dict[str, Any], verifier: Verifier) -> tuple[Divergence | None, int]:
    """A row played through the tool `act` (TRL's environment interface): each call that reached the tool is
    called again under the tool's own rules (hubgym.verifiers.act.ActEpisode); its result must be the stored
    tool result and a step's reward the stored one. The model may stop calling `act` before the env ends the
    episode: that is how such an episode ends, no divergence."""
    completion, rewards = row["completion"], stored_step_rewards(row.get("metrics")) or {}
    failed = row["error"] if (row.get("error") or {}).get("boundary") == "env" else None
    results = {m["tool_call_id"]: m for m in completion if m["role"] == "tool" and m.get("tool_call_id")}
    try:
        task, _, observation, stored = _reset(row, verifier)
        episode = ActEpisode(verifier, task)
    except Exception as exc:
        return _raised(0, failed, exc), 0
    if stored != (observation or None):
        return Divergence(0, "observation", stored, observation), 0
    turn = 0
    for m in completion:
        turn += m["role"] == "assistant"
        for call in (m.get("tool_calls") or []) if m["role"] == "assistant" else []:
            reaches, action = act_action(call["arguments"])
            if call["name"] != ACT_TOOL or call["id"] not in results or not reaches:
                continue
            try:
                outcome = episode.act(action)
            except Exception as exc:
                return _raised(turn, failed, exc), len(episode.rewards)
            if results[call["id"]]["content"] != outcome.result:
                return Divergence(turn, "observation", results[call["id"]]["content"], outcome.result), \
                    len(episode.rewards)
            step = len(episode.rewards) - 1
            if outcome.reward is not None and not _same(rewards.get(step), outcome.reward):
                return Divergence(turn, "reward", rewards.get(step), outcome.reward), len(episode.rewards)
    if len(rewards) > len(episode.rewards):
        return Divergence(turn, "reward", rewards[min(set(rewards) - set(range(len(episode.rewards))))], None), \
            len(episode.rewards)
    if failed:
        return Divergence(turn, "error", f"{failed['type']}: {failed['message']}", None), len(episode.rewards)
    return None, len(episode.rewards)


def _reset(row: dict[str, Any], verifier: Verifier) -> tuple[dict, Any, str, str | None]:
    """reset() on the task the loop saw: the stored prompt without the reset observation the loop appended.

    Returns (task, state, observation, the observation as stored or None).
    """
    prompt = list(row["prompt"])
    if prompt and prompt[-1]["role"] == "user":
        task = _task(row, prompt[:-1])
        state, observation = verifier.reset(task)
        if observation:
            return task, state, observation, prompt[-1]["content"]
    task = _task(row, prompt)
    state, observation = verifier.reset(task)
    return task, state, observation, None


def _task(row: dict[str, Any], prompt: list[dict]) -> dict[str, Any]:
    return {"id": row["task_id"], "env": row["env"], "prompt": prompt, "info": row["info"],
            "interaction": row["interaction"]}


def _raised(turn: int, failed: dict | None, exc: Exception) -> Divergence | None:
    """None when the row recorded this very env error at this point; else an `error` divergence."""
    if failed and failed["type"] == type(exc).__name__:
        return None
    stored = f"{failed['type']}: {failed['message']}" if failed else None
    return Divergence(turn, "error", stored, f"{type(exc).__name__}: {str(exc)[:200]}")


def _same(stored: float | None, replayed: float) -> bool:
    return stored is not None and math.isclose(stored, float(replayed), rel_tol=1e-9, abs_tol=1e-12)


# ---- tokens -----------------------------------------------------------------------------------------------------


def audit_tokens(row: dict[str, Any], tokenizer_or_renderer: Any, own_tools: Any = None) -> TokenAudit:
    """The token audit of one row: `hubgym.rollout.tokens.audit_tokens`, the very check the rollout writer
    records as `tokens_consistent`, with a tokenizer, a renderer or a model folder (`own_tools`: the env's
    own tools, an EnvTools, whose schemas the loop rendered)."""
    return audit_row(row, as_renderer(tokenizer_or_renderer), own=own_tools)


def as_renderer(tokenizer_or_renderer: Any) -> ChatRenderer:
    """A ChatRenderer from a renderer, a tokenizer, or a model folder."""
    if isinstance(tokenizer_or_renderer, ChatRenderer):
        return tokenizer_or_renderer
    if isinstance(tokenizer_or_renderer, (str, Path)):
        from transformers import AutoTokenizer

        tokenizer_or_renderer = AutoTokenizer.from_pretrained(str(tokenizer_or_renderer))
    return ChatRenderer(tokenizer_or_renderer)


# ---- many rows --------------------------------------------------------------------------------------------------


def iter_replay(rows: Iterable[dict[str, Any]], *, rollout: str | None = None, renderer: Any = None,
                verifier: VerifierArg | VerifierChoice = None) -> Iterator[ReplayResult]:
    """Replay rows one at a time (any iterable: local shards, a Hub stream, a list).

    `verifier` chooses each env's verifier as in `hubgym score` (`MODULE`, `ENV=MODULE`, {env: module}, or a
    VerifierChoice with hub env revisions); other envs use their registered verifier. A row's env never
    names code by itself (hubgym.envs.stored).
    """
    choice = verifier if isinstance(verifier, VerifierChoice) else VerifierChoice(verifier)
    verifiers: dict[str, Verifier] = {}
    found = False
    for row in rows:
        if rollout is not None and row["rollout_id"] != rollout:
            continue
        found = True
        if row["env"] not in verifiers:
            verifiers[row["env"]] = load_verifier_of(choice.spec(row["env"]))
        yield replay_rollout(row, verifiers[row["env"]], renderer)
    if rollout is not None and not found:
        raise RolloutNotFoundError(f"no rollout {rollout!r} in the rows replayed; rollout ids read "
                                   f"RUN-TASK-SAMPLE (the rollout_id column): check the id and the source, or "
                                   f"leave out --rollout")


def replay(source: str | os.PathLike | Iterable, *, rollout: str | None = None, model: str | Path | None = None,
           hub: str | None = None, verifier: VerifierArg | VerifierChoice = None) -> ReplayReport:
    """Replay every row of `source` (run folders, shard files, hub refs, or an iterable of row dicts).

    With `model` (a model folder, tokenizer or ChatRenderer) every row's tokens are audited too.
    """
    renderer = as_renderer(model) if model is not None else None
    return ReplayReport(list(iter_replay(rows_of(source, hub), rollout=rollout, renderer=renderer,
                                         verifier=verifier)))


def rows_of(source: str | os.PathLike | Iterable, hub: str | None = None, *,
            skip_bad: bool = False) -> Iterable[dict[str, Any]]:
    """Rows of a source: run folders, shard files and hub refs `org/name[@rev][:RUN]` are streamed shard by
    shard (each checked against its recorded sha256); any other iterable is taken as the rows themselves."""
    from hubgym.hub.rollouts import iter_rollouts

    if isinstance(source, (str, os.PathLike)):
        source = [source]
    if isinstance(source, (list, tuple)) and all(isinstance(s, (str, os.PathLike)) for s in source):
        return iter_rollouts(list(source), hub=hub, skip_bad=skip_bad)
    return source
