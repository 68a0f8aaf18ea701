"""Replay stored rollouts: re-run multi_turn dynamics from the stored actions, and audit the tokens.

    report = replay(["runs/r1"], model="model_dir")      # every row of every shard
    report.diverged                                       # ReplayResult for each row that did not reproduce

Dynamics: the verifier's pure `reset`/`step` are run on the stored actions (the assistant turns
that are not tool calls); the reset observation, every stored observation and every stored
per-step reward (`step/<i>/reward` metrics) must come out the same. The first difference is
reported with its turn and field.

Tokens: the chat template is applied again to the stored messages, and the stored token ids
(decoded) must read as that rendering, turn after turn. A template that rewrites earlier turns
(for instance one that strips the reasoning of past turns) shows up here, with the character
offset and the turn where the stored record and the template part ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hubgym.verifiers.contract import Verifier, actions_of


@dataclass(frozen=True)
class Divergence:
    turn: int  # 0 = the reset observation; i = after the i-th action
    field: str  # observation | reward | done | token
    stored: Any
    replayed: Any


@dataclass
class ReplayResult:
    rollout_id: str
    env: str
    replayed: bool  # False for rows with no dynamics to replay (single_turn, tool_use)
    divergence: Divergence | None = None
    token_divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None and self.token_divergence is None


@dataclass
class ReplayReport:
    results: list[ReplayResult] = field(default_factory=list)

    @property
    def diverged(self) -> list[ReplayResult]:
        return [r for r in self.results if not r.ok]

    def counts(self) -> dict[str, int]:
        return {"rollouts": len(self.results), "replayed": sum(r.replayed for r in self.results),
                "reproduced": sum(r.replayed and r.divergence is None for r in self.results),
                "diverged": sum(r.divergence is not None for r in self.results),
                "token_audit_failures": sum(r.token_divergence is not None for r in self.results)}


def replay_dynamics(row: dict[str, Any], verifier: Verifier) -> Divergence | None:
    """The first place where re-running reset/step on the stored actions differs from the row."""
    task = {"id": row["task_id"], "env": row["env"], "prompt": row["prompt"], "info": row["info"],
            "interaction": row["interaction"]}
    rewards = {int(m["name"].split("/")[1]): m["value"] for m in row.get("metrics") or []
               if m["name"].startswith("step/") and m["name"].endswith("/reward")}
    actions = actions_of(row["completion"])
    # The loop steps the env once per reply it accepts (a truncated reply is not an action): as many
    # actions as stored step rewards; rows without them count the actions an observation followed.
    stepped = len(rewards) if rewards else sum(o is not None for o in _observations(row["completion"]))
    actions = actions[:stepped]
    episode = verifier.run_episode(task, actions)
    stored_reset = row["prompt"][-1]["content"] if row["prompt"] and row["prompt"][-1]["role"] == "user" else ""
    if episode.observation and episode.observation != stored_reset:
        return Divergence(0, "observation", stored_reset, episode.observation)
    observations = _observations(row["completion"])
    for i, step in enumerate(episode.steps):
        stored = observations[i] if i < len(observations) else None
        if step.observation and stored != step.observation:
            return Divergence(i + 1, "observation", stored, step.observation)
        if i in rewards and abs(rewards[i] - step.reward) > 1e-9:
            return Divergence(i + 1, "reward", rewards[i], step.reward)
    if len(rewards) > len(episode.steps):
        return Divergence(len(episode.steps) + 1, "done", f"{len(rewards)} steps stored",
                          f"the episode ended after {len(episode.steps)}")
    return None


def _observations(completion: list[dict]) -> list[str | None]:
    """The observation that followed each env action (None when the env said nothing)."""
    out: list[str | None] = []
    for i, message in enumerate(completion):
        if message["role"] == "assistant" and not message.get("tool_calls"):
            following = completion[i + 1] if i + 1 < len(completion) else None
            out.append(following["content"] if following and following["role"] == "user" else None)
    return out


def audit_tokens(row: dict[str, Any], renderer) -> Divergence | None:
    """Where the stored ids (decoded) stop reading as the chat template's rendering of the messages."""
    stored = renderer.tokenizer.decode(list(row["prompt_ids"]) + list(row["completion_ids"]),
                                       skip_special_tokens=False)
    tools = None
    if row["interaction"]["tools"]:
        from hubgym.tools.registry import make_toolbox

        tools = make_toolbox(row["interaction"]["tools"], row).schemas()
    rendered = renderer.render(list(row["prompt"]) + list(row["completion"]), tools, add_generation_prompt=False)
    at = _common_prefix(stored, rendered)
    if at >= len(stored) or at >= len(rendered) or not rendered[at:].strip() or not stored[at:].strip("\ufffd \n"):
        # One is a prefix of the other (up to the closing of the last turn), or the stored ids end in a
        # character cut in half by max_tokens (decoded as U+FFFD; the message text drops it).
        return None
    turn = rendered[:at].count("<|im_start|>assistant")
    return Divergence(turn, "token", stored[max(0, at - 20):at + 40], rendered[max(0, at - 20):at + 40])


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def replay(sources: list[str | Path], *, rollout: str | None = None, model: str | Path | None = None,
           hub: str | None = None) -> ReplayReport:
    """Replay every row of `sources` (or only `rollout`); audit tokens when a model folder is given."""
    from hubgym.builders.registry import resolve_env
    from hubgym.hub.rollouts import iter_rollout_rows

    renderer = _renderer(model) if model else None
    verifiers: dict[str, Verifier] = {}
    report = ReplayReport()
    for row in iter_rollout_rows(list(sources), hub=hub):
        if rollout and row["rollout_id"] != rollout:
            continue
        verifier = verifiers.get(row["env"]) or verifiers.setdefault(row["env"], resolve_env(row["env"]).verifier())
        dynamic = row["interaction"]["kind"] == "multi_turn" and verifier.multi_turn and row.get("error") is None
        result = ReplayResult(row["rollout_id"], row["env"], dynamic)
        if dynamic:
            result.divergence = replay_dynamics(row, verifier)
        if renderer is not None:
            result.token_divergence = audit_tokens(row, renderer)
        report.results.append(result)
    return report


def _renderer(model: str | Path):
    from transformers import AutoTokenizer

    from hubgym.rollout.tokens import ChatRenderer

    return ChatRenderer(AutoTokenizer.from_pretrained(str(model)))
