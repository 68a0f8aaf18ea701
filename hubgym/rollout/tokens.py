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
the template renders) say different things. One thing a row cannot show is flagged by the loop alone: a
turn whose logprobs the engine did not return (stored as 0.0).
"""

from __future__ import annotations

import hashlib
import json
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
    """Check that the stored ids say what the stored messages say. Two parts:

    1. The stored ids, decoded, read as the chat template's rendering of the messages, each assistant turn
       rendered as the text its sampled tokens spell (so a tool call keeps the spelling the model sampled,
       not the template's canonical one). Compared as text, not ids: the model may sample a spelling the
       tokenizer would not produce (that is not an error). The ids may stop before the rendering ends (a
       reply cut short, an episode that ended with an observation).
    2. Each assistant message is what the loop makes of that text: the text itself, or, when tools are
       offered, its free text and tool calls as `parse_tool_calls` reads them. A special token sampled
       inside a reply and left out of its text fails here.

    An incomplete character at the end of a reply (the engine's detokenizer holds such bytes back) is no
    difference. `tools`: the tool schemas the loop rendered; by default made from the row's tool names, as
    the loop made them. The first stored token that does not match is reported.
    """
    ids = list(row["prompt_ids"]) + list(row["completion_ids"])
    if not ids:
        return TokenAudit(0)
    tools = tools if tools is not None else _tools(row)
    runs = _sampled_runs(row)
    replies = [_decode(renderer, _reply_ids(ids[a:b], renderer)) for a, b in runs]
    messages, turns = list(row["prompt"]) + list(row["completion"]), _assistant_turns(row)
    if len(turns) == len(runs):  # one run of sampled tokens per assistant turn: render each as sampled
        for i, text in zip(turns, replies):
            messages[i] = {**messages[i], "content": text, "tool_calls": None}
    # The record ends with a generation prompt exactly when the last message is not the model's.
    rendered = renderer.render(messages, tools, add_generation_prompt=messages[-1]["role"] != "assistant")
    stored = _decode_pieces(ids, runs, replies, renderer)
    at = _common_prefix(stored, rendered)
    if at < len(stored):
        index = _first_token_past(renderer, ids, at)
        turn, part = _turn_of(row, index)
        return TokenAudit(len(ids), index, turn, part, _around(stored, at), _around(rendered, at))
    for turn, ((start, end), text, i) in enumerate(zip(runs, replies, turns), 1):
        message = row["completion"][i - len(row["prompt"])]
        if not _loop_reading(text, bool(row["interaction"]["tools"]), message):
            shown = (message["content"] or "") + "".join(f"<tool_call>{_call_key(c)}" for c in
                                                         message.get("tool_calls") or [])
            at = _common_prefix(text, shown)
            index = start + _first_token_past(renderer, ids[start:end], at)
            return TokenAudit(len(ids), index, turn, "model", _around(text, at), _around(shown, at))
    return TokenAudit(len(ids))


def _sampled_runs(row: dict[str, Any]) -> list[tuple[int, int]]:
    """[start, end) of each run of sampled tokens (mask 1), as indices into prompt_ids + completion_ids."""
    runs, offset, mask = [], len(row["prompt_ids"]), list(row["completion_mask"])
    for j, m in enumerate(mask):
        if m == 1 and (j == 0 or mask[j - 1] == 0):
            runs.append([offset + j, offset + j + 1])
        elif m == 1:
            runs[-1][1] = offset + j + 1
    return [(a, b) for a, b in runs]


def _assistant_turns(row: dict[str, Any]) -> list[int]:
    """Indices of the assistant messages in prompt + completion."""
    return [len(row["prompt"]) + i for i, m in enumerate(row["completion"]) if m["role"] == "assistant"]


def _reply_ids(ids: list[int], renderer: ChatRenderer) -> list[int]:
    """A turn's sampled ids without the end-of-turn token it stopped on (not part of the reply's text)."""
    eos = renderer.tokenizer.eos_token_id
    return ids[:-1] if ids and ids[-1] == eos else ids


def _decode_pieces(ids: list[int], runs: list[tuple[int, int]], replies: list[str], renderer: ChatRenderer) -> str:
    """The stored ids decoded piece by piece, each reply as its text (without an incomplete last character)."""
    pieces, at = [], 0
    for (start, end), text in zip(runs, replies):
        kept = len(_reply_ids(ids[start:end], renderer))
        pieces += [_decode(renderer, ids[at:start]), text, _decode(renderer, ids[start + kept:end])]
        at = end
    return "".join(pieces) + _decode(renderer, ids[at:])


def _loop_reading(text: str, tools_offered: bool, message: Message) -> bool:
    """Whether `message` is what the loop makes of a reply that reads `text`."""
    if not tools_offered:
        return (message["content"] or "") == text and not message.get("tool_calls")
    from hubgym.rollout.parsing import parse_tool_calls

    parsed = parse_tool_calls(text, "call")
    content = parsed.content if parsed.calls else text
    calls = [_call_key(c) for c in parsed.calls] == [_call_key(c) for c in message.get("tool_calls") or []]
    return calls and (message["content"] or "").strip() == content.strip()


def _call_key(call: dict[str, Any]) -> str:
    """A tool call's name and arguments, the arguments as parsed JSON where they are JSON (spelling aside)."""
    try:
        arguments = json.dumps(json.loads(call["arguments"]), sort_keys=True)
    except (TypeError, ValueError):
        arguments = call["arguments"]
    return f"{call['name']}({arguments})"


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
