"""One token sequence per trajectory, extended turn by turn, never re-tokenized.

The model's sampled ids (mask 1, with the engine's logprobs) are kept as sampled. Between
turns, the tokens of tool results and environment observations (mask 0, logprob 0.0) are the
chat template's rendering of those messages: the text the template adds after the history.
That is only sound when the template is *prefix-consistent*: rendering the history plus new
messages must start with the rendering of the history. Templates that rewrite earlier turns
(e.g. strip earlier reasoning) break it; the record then says so (`consistent = False`).

What "consistent" means is one function, `audit_tokens`: the stored ids, decoded, read as the chat
template's rendering of the stored messages. The rollout writer applies it to every row as the row is
made (`tokens_consistent`), and `hubgym replay` applies it again to stored rows, so the two always agree.
A row that fails it is not trained on: its token record and its messages (what the verifier scored, what
the template renders) say different things.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from hubgym.schemas.messages import Message, assistant, to_openai, user

_MARK = "\x00hubgym-mark\x00"


@dataclass
class TokenRecord:
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 = sampled by the model, 0 = tool/env/template
    logprobs: list[float] = field(default_factory=list)
    consistent: bool = True
    problems: list[str] = field(default_factory=list)

    def sequence(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def add_model(self, ids: list[int], logprobs: list[float]) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"engine returned {len(ids)} token ids but {len(logprobs)} logprobs")
        self.completion_ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += logprobs

    def add_env(self, ids: list[int]) -> None:
        self.completion_ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def mark_inconsistent(self, why: str) -> None:
        self.consistent = False
        self.problems.append(why)


class ChatRenderer:
    """Renders messages with a tokenizer's chat template and computes the tokens between turns."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.template = tokenizer.chat_template or ""
        self.template_sha256 = hashlib.sha256(self.template.encode()).hexdigest()
        self.eos_text: str = tokenizer.eos_token or ""
        rendered = self.render([user("x"), assistant(_MARK)], None, add_generation_prompt=False)
        self.turn_closing = rendered.split(_MARK, 1)[1]  # what follows an assistant's content, e.g. "<|im_end|>\n"

    def render(self, messages: list[Message], tools: list[dict] | None, *, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template([to_openai(m) for m in messages], tools=tools or None,
                                                  tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def bridge(self, history: list[Message], reply: Message, new: list[Message], tools: list[dict] | None,
               ended_with_eos: bool) -> tuple[list[int], str | None]:
        """Tokens that follow the model's sampled reply: the turn's closing plus the new messages.

        Returns (ids, problem); problem is None when the template is prefix-consistent here.
        """
        before = self.render(history + [reply], tools, add_generation_prompt=False)
        after = self.render(history + [reply] + new, tools, add_generation_prompt=True)
        closing = self.turn_closing
        if ended_with_eos and self.eos_text and closing.startswith(self.eos_text):
            closing = closing[len(self.eos_text):]  # the model already sampled the end-of-turn token
        if after.startswith(before):
            return self.encode(closing + after[len(before):]), None
        common = _common_prefix(before, after)
        problem = f"chat template is not prefix-consistent: earlier turns render differently at char {common}"
        return self.encode(closing + self._new_turns(history, reply, new, tools, after, common)), problem

    def _new_turns(self, history: list[Message], reply: Message, new: list[Message], tools: list[dict] | None,
                   after: str, common: int) -> str:
        """The text `after` spends on the new messages alone, for templates that rewrite earlier turns.

        The stored tokens keep what the model really sampled; only the new turns are appended, never
        a second, rewritten copy of the history. They start after the last turn closing before the
        first new message's content (found with a marker in that content).
        """
        if new and new[0]["content"]:
            probe = self.render(history + [reply, {**new[0], "content": _MARK}] + new[1:], tools,
                                add_generation_prompt=True)
            at = probe.find(_MARK)
            start = probe.rfind(self.turn_closing, 0, at) if at >= 0 else -1
            if start >= 0 and probe[:at] == after[:at]:
                return after[start + len(self.turn_closing):]
        elif not new and self.turn_closing in after:  # only the generation prompt follows the reply
            return after[after.rfind(self.turn_closing) + len(self.turn_closing):]
        return after[common:]


# ---- the audit: do the stored ids read as the template's rendering of the stored messages? ---------------------

CONTEXT = 40  # characters of text shown on each side of a mismatch


@dataclass(frozen=True)
class TokenAudit:
    """Whether the stored token ids are the chat template's rendering of the stored messages."""

    tokens: int  # len(prompt_ids) + len(completion_ids)
    index: int | None = None  # first stored token (into prompt_ids + completion_ids) the template does not produce
    turn: int | None = None  # assistant turn that token belongs to (0 = the prompt)
    part: str | None = None  # prompt | model (sampled, mask 1) | env (tool/env/template, mask 0)
    stored: str = ""  # decoded stored text around the mismatch
    rendered: str = ""  # the template's text at the same place

    @property
    def ok(self) -> bool:
        return self.index is None


def audit_tokens(row: dict[str, Any], renderer: ChatRenderer, tools: list[dict] | None = None) -> TokenAudit:
    """Check that the stored ids, decoded, read as the chat template's rendering of the stored messages.

    Compared as text, not ids: the model may sample a spelling the tokenizer would not produce (that is not
    an error), but every token it sampled must show in the messages (a special token dropped from a reply's
    text fails here). The stored ids may stop before the rendering ends (a reply cut short, an episode that
    ended with an observation). `tools`: the tool schemas the loop rendered; by default made from the row's
    tool names, as the loop made them. The first stored token whose text leaves the rendering is reported.
    """
    ids = list(row["prompt_ids"]) + list(row["completion_ids"])
    if not ids:
        return TokenAudit(0)
    messages = list(row["prompt"]) + list(row["completion"])
    tools = tools if tools is not None else _tools(row)
    # The record ends with a generation prompt exactly when the last message is not the model's.
    rendered = renderer.render(messages, tools, add_generation_prompt=messages[-1]["role"] != "assistant")
    stored = _decode(renderer, ids)
    at = _common_prefix(stored, rendered)
    if at == len(stored):
        return TokenAudit(len(ids))
    index = _first_token_past(renderer, ids, at)
    turn, part = _turn_of(row, index)
    return TokenAudit(len(ids), index, turn, part, _around(stored, at), _around(rendered, at))


def _tools(row: dict[str, Any]) -> list[dict] | None:
    """The tool schemas the loop rendered into the prompt."""
    if not row["interaction"]["tools"]:
        return None
    from hubgym.tools.registry import make_toolbox

    task = {"id": row["task_id"], "env": row["env"], "prompt": row["prompt"], "info": row["info"],
            "interaction": row["interaction"]}
    return make_toolbox(row["interaction"]["tools"], task).schemas()


def _decode(renderer: ChatRenderer, ids: list[int]) -> str:
    # The fast tokenizer's own decoder when there is one: no clean-up of spaces, and no per-id type checks.
    backend = getattr(renderer.tokenizer, "backend_tokenizer", None)
    text = backend.decode(ids, skip_special_tokens=False) if backend else renderer.tokenizer.decode(ids)
    # A reply cut by max_tokens may end inside a multi-byte character: decoded as U+FFFD, absent from the message.
    return text.rstrip("\ufffd")


def _first_token_past(renderer: ChatRenderer, ids: list[int], at: int) -> int:
    """The smallest k whose decoded prefix ids[:k+1] reaches past character `at` (binary search: O(log n) decodes)."""
    lo, hi = 0, len(ids) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_decode(renderer, ids[:mid + 1])) > at:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _turn_of(row: dict[str, Any], index: int) -> tuple[int, str]:
    """(assistant turn, part) of a stored token: the prompt is turn 0; each run of sampled tokens starts a turn."""
    prompt = len(row["prompt_ids"])
    if index < prompt:
        return 0, "prompt"
    mask = list(row["completion_mask"])[: index - prompt + 1]
    turn = sum(1 for j, m in enumerate(mask) if m == 1 and (j == 0 or mask[j - 1] == 0))
    return turn, "model" if mask and mask[-1] == 1 else "env"


def _around(text: str, at: int) -> str:
    return text[max(0, at - CONTEXT):at] + "⟨here⟩" + text[at:at + CONTEXT]


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix (binary search over slice comparisons, which run in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
