"""One stored rollout as the trajectory page shows it: messages with their tool calls and step rewards, the task's
`info`, reward components (stored, and re-scored where the run was), and the token record, model tokens told from
env/tool ones and shaded by their probability (SCALE).

Everything comes from the row, which is untrusted: values are only read and passed to the template (which escapes
them); tool-call arguments are shown as text, pretty-printed when they are JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from hubgym.verifiers.act import (ACT_TOOL, ENV_FAILED, EPISODE_OVER, NO_TURNS_LEFT, NOT_TEXT, act_action,
                                  driven_by_act)
from hubgym.verifiers.contract import stored_step_rewards

REFUSALS = (EPISODE_OVER, NO_TURNS_LEFT, NOT_TEXT)

Decode = Callable[[int], str]


@dataclass(frozen=True)
class ShownMessage:
    role: str
    content: str
    part: str  # "prompt" or "completion"
    tool_calls: list[dict[str, str]]  # {id, name, arguments (pretty text)}
    tool_call_id: str | None
    name: str | None
    reasoning: str | None
    step: int | None  # the env step this assistant turn was (multi_turn), else None
    step_reward: float | None
    tool_failed: bool  # a tool result that starts with "Error: "


@dataclass(frozen=True)
class Token:
    text: str
    id: int
    model: bool  # sampled by the model (mask 1); else a tool/env token
    logprob: float | None
    level: int | None = None  # where its probability falls on SCALE (0: likeliest); None: no logprob


@dataclass(frozen=True)
class Level:
    level: int
    label: str
    floor: float  # the least probability of this level


SCALE = tuple(Level(i, label, floor) for i, (label, floor) in enumerate((
    ("p >= 0.9", 0.9), ("0.7", 0.7), ("0.5", 0.5), ("0.3", 0.3), ("0.1", 0.1), ("0.03", 0.03), ("0.01", 0.01),
    ("p < 0.01", 0.0))))
"""The colour scale of a token's probability exp(logprob), readable without hovering: eight levels, each a class
(`lp0`..`lp7`) the stylesheet colours (a page whose policy allows no inline style can still shade every token)."""


def level_of(logprob: float | None) -> int | None:
    """The SCALE level of a logprob (None when there is none)."""
    if logprob is None:
        return None
    p = math.exp(min(logprob, 0.0))
    return next(s.level for s in SCALE if p >= s.floor)


def info_text(row: dict[str, Any]) -> str:
    """The task's `info` (the expected answer, the hidden word...: what the verifier scored against), as JSON."""
    info = row.get("info")
    try:
        return json.dumps(info, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):  # a hand-made shard: keys that do not sort (mixed types)
        return json.dumps(info, indent=2, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class Component:
    name: str
    old: float | None
    new: float | None

    @property
    def changed(self) -> bool:
        if self.old is None or self.new is None:
            return self.old is not self.new
        return abs(self.old - self.new) > 1e-9


def messages(row: dict[str, Any]) -> list[ShownMessage]:
    """Prompt then completion; a multi_turn row's env actions carry their step number and the step reward stored for
    it: assistant turns without tool calls, or, in a row played through the tool `act` (TRL's environment
    interface), the turns whose `act` calls stepped the env (`_act_steps`)."""
    steps = stored_step_rewards(_named(row.get("metrics")))  # None: not a multi_turn row (no step was taken)
    completion = row.get("completion") or []
    by_act = steps is not None and driven_by_act(row.get("interaction") or {"kind": ""})
    stepping = _act_steps(completion) if by_act else None
    out = [_shown(m, "prompt", None, None) for m in row.get("prompt") or []]
    action = 0
    for i, m in enumerate(completion):
        step = None
        if stepping is not None:
            step = stepping.get(i)
        elif steps is not None and m.get("role") == "assistant" and not m.get("tool_calls"):
            step, action = action, action + 1
        out.append(_shown(m, "completion", step, steps.get(step) if step is not None else None))
    return out


def _act_steps(completion: list[dict[str, Any]]) -> dict[int, int]:
    """{message index: its first step} for the assistant turns whose `act` calls stepped the env: read from the
    stored results (a call that did not step was answered with one of the tool's fixed refusals, or not run)."""
    results = {m.get("tool_call_id"): m.get("content") for m in completion if m.get("role") == "tool"}
    found, step = {}, 0
    for i, m in enumerate(completion):
        for call in (m.get("tool_calls") or []) if m.get("role") == "assistant" else []:
            result = results.get(call.get("id"))
            if call.get("name") != ACT_TOOL or result is None or not act_action(call.get("arguments"))[0] \
                    or result in REFUSALS or str(result).startswith(("{'error'", ENV_FAILED)):
                continue
            found.setdefault(i, step)
            step += 1
    return found


def _shown(m: dict[str, Any], part: str, step: int | None, reward: float | None) -> ShownMessage:
    calls = [{"id": str(c.get("id") or ""), "name": str(c.get("name") or ""), "arguments": _pretty(c.get("arguments"))}
             for c in m.get("tool_calls") or []]
    content = str(m.get("content") or "")
    return ShownMessage(str(m.get("role") or ""), content, part, calls, m.get("tool_call_id"), m.get("name"),
                        m.get("reasoning"), step, reward, m.get("role") == "tool" and content.startswith("Error: "))


def _pretty(arguments: Any) -> str:
    text = str(arguments or "")
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def components(row: dict[str, Any]) -> list[Component]:
    """Each reward component, stored and (in a re-scored run) new, in the order first seen."""
    old = {m["name"]: m["value"] for m in _named(row.get("metrics"))}
    new = {m["name"]: m["value"] for m in _named(row.get("rescore_metrics"))}
    names = list(dict.fromkeys([*old, *new]))
    return [Component(n, old.get(n), new.get(n)) for n in names]


def _named(metrics: Any) -> list[dict[str, Any]]:
    """The metric entries that have a name (a hand-made shard may hold others; they are not shown)."""
    return [m for m in metrics or [] if isinstance(m, dict) and isinstance(m.get("name"), str)]


def tokens(row: dict[str, Any], decode: Decode | None) -> list[Token]:
    ids = row.get("completion_ids") or []
    mask = row.get("completion_mask") or []
    logprobs = row.get("completion_logprobs") or []
    out = []
    for i, token_id in enumerate(ids):
        model = bool(mask[i]) if i < len(mask) else True
        lp = logprobs[i] if i < len(logprobs) and model else None
        lp = lp if lp is not None and math.isfinite(lp) else None
        out.append(Token(decode(token_id) if decode else f"[{token_id}]", int(token_id), model, lp, level_of(lp)))
    return out


class TokenDecoder:
    """Single token ids -> text with one tokenizer; `vocab_size` bounds the ids it takes (the store holds the rows
    it reads to it: the row contract's vocabulary rule). An id past it is shown as `[id]`, never decoded."""

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.vocab_size = tokenizer, len(tokenizer)
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            return f"[{token_id}]"
        if token_id not in self._cache:
            self._cache[token_id] = self.tokenizer.decode([token_id])
        return self._cache[token_id]


def tokenizer_decoder(model: str) -> TokenDecoder:
    """Decode single token ids with the tokenizer of `model` (`tiny`, `smollm2-135m`, a folder or a Hub id, as
    everywhere in hubgym), which the user names: stored rows never choose what is loaded."""
    from transformers import AutoTokenizer

    from hubgym.models import resolve_model

    return TokenDecoder(AutoTokenizer.from_pretrained(resolve_model(model, setting="--tokenizer",
                                                                    needs=("tokenizer.json", "tokenizer_config.json"))))
