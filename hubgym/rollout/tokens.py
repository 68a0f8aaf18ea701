"""One token sequence per trajectory, extended turn by turn, never re-tokenized.

The model's sampled ids (mask 1, with the engine's logprobs) are kept as sampled. Between
turns, the tokens of tool results and environment observations (mask 0, logprob 0.0) are the
chat template's rendering of those messages: the text the template adds after the history.
That is only sound when the template is *prefix-consistent*: rendering the history plus new
messages must start with the rendering of the history. Templates that rewrite earlier turns
(e.g. strip earlier reasoning) break it; the record then says so (`consistent = False`).

What "consistent" means is one function, `audit_tokens`: the stored ids, decoded, read as the chat
template's rendering of the stored messages. The rollout writer applies it to every row as the row is
made (`tokens_consistent`), and `hubgym replay` applies it again to stored rows, so the two always agree:
the renderer takes the chat options a row's provenance records (`chat_template_kwargs`, `tool_parser`,
`reasoning_parser`) before auditing it. A turn ends on one of the model's stop ids (the tokenizer's eos and
generation_config.json's `eos_token_id`, as vLLM stops); the one the template's turn closing starts with
(`<|im_end|>` for ChatML) is the model's sampled token, never added a second time between turns.
A row that fails it is not trained on: its token record and its messages (what the verifier scored, what
the template renders) say different things. One thing a row cannot show is flagged by the loop alone: a
turn whose logprobs the engine did not return (stored as 0.0).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from hubgym.errors import ChatFormatError
from hubgym.rollout.parsing import HERMES, ReplyParser
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
            raise ChatFormatError(f"engine returned {len(ids)} token ids but {len(logprobs)} logprobs")
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
    """Renders messages with a tokenizer's chat template and computes the tokens between turns.

    `chat_template_kwargs` go to every `apply_chat_template` call (e.g. {"enable_thinking": False});
    `tool_parser` / `reasoning_parser` pick how replies are read (`parsing.ReplyParser`). The loop, the
    writer's audit and `hubgym replay` all render and read through one renderer, so they agree.
    """

    def __init__(self, tokenizer: Any, *, chat_template_kwargs: dict[str, Any] | None = None,
                 tool_parser: str = HERMES, reasoning_parser: str | None = None):
        self.tokenizer = tokenizer
        self.chat_template_kwargs = check_chat_template_kwargs(chat_template_kwargs)
        self.parser = ReplyParser(tokenizer, tool_parser, reasoning_parser, self.chat_template_kwargs)
        self.template = tokenizer.chat_template or ""
        # What apply_chat_template passes to the template besides the messages (see `render`), made once.
        special = getattr(tokenizer, "special_tokens_map", None) if hasattr(tokenizer, "get_chat_template") else None
        self._template_kwargs = None if special is None else {**special, **self.chat_template_kwargs}
        self._templates: dict[bool, str] = {}  # the template for renders without (True) and with tools
        self.template_sha256 = hashlib.sha256(self.template.encode()).hexdigest()
        self.eos_text: str = tokenizer.eos_token or ""
        self.stop_ids: frozenset[int] = stop_token_ids(tokenizer)
        rendered = self.render([user("x"), assistant(_MARK)], None, add_generation_prompt=False)
        self.turn_closing = rendered.split(_MARK, 1)[1]  # what follows an assistant's content, e.g. "<|im_end|>\n"
        # The stop token the closing starts with: sampled by the model, so the bridge does not add it again.
        stops = [self.eos_text] + [tokenizer.convert_ids_to_tokens(i) for i in sorted(self.stop_ids)]
        self.closing_stop: str = next((t for t in stops if t and self.turn_closing.startswith(t)), "")
        self.incremental = True  # bridges render the recent turns only (see `bridge`)
        self._checks_left = self.INCREMENTAL_CHECKS

    def chat_options(self) -> dict[str, Any]:
        """The options that change how this renderer renders and reads, as a run records them (defaults left out)."""
        return recorded_options({"tool_parser": self.parser.tool_parser,
                                 "reasoning_parser": self.parser.reasoning_parser,
                                 "chat_template_kwargs": self.chat_template_kwargs})

    def for_row(self, row: dict[str, Any]) -> ChatRenderer:
        """A renderer with the chat options the row was sampled with (its provenance records them), so a
        replay renders and reads a row as its run did. A row that records none gets this renderer."""
        recorded = recorded_chat_options(row)
        if recorded is None or recorded == self.chat_options():
            return self
        key = json.dumps(recorded, sort_keys=True)
        variants = self.__dict__.setdefault("_variants", {})
        if key not in variants:
            variants[key] = ChatRenderer(self.tokenizer, **recorded)
        return variants[key]

    @functools.cached_property
    def renders_tools(self) -> bool:
        """Whether the template shows the model its tools: rendering with one tool differs from rendering none."""
        probe = {"type": "function", "function": {"name": "hubgym_probe", "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}
        messages = [user("x")]
        return self.render(messages, [probe], add_generation_prompt=True) != self.render(
            messages, None, add_generation_prompt=True)

    def render(self, messages: list[Message], tools: list[dict] | None, *, add_generation_prompt: bool) -> str:
        """The chat template's text for `messages`: what `apply_chat_template(..., tokenize=False)` returns, through
        the function it calls (`render_jinja_template`) with the template and the special tokens looked up once:
        `apply_chat_template` rebuilds the special-tokens map on every call, a quarter of a render's time."""
        conversation, tools = [to_openai(m) for m in messages], tools or None
        if self._template_kwargs is None:  # a tokenizer without transformers' chat-template internals
            return self.tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      **self.chat_template_kwargs)
        from transformers.utils.chat_template_utils import render_jinja_template

        template = self._templates.get(tools is None) or self._templates.setdefault(
            tools is None, self.tokenizer.get_chat_template(None, tools))
        rendered, _ = render_jinja_template(conversations=[conversation], tools=tools, documents=None,
                                            chat_template=template, return_assistant_tokens_mask=False,
                                            continue_final_message=False, add_generation_prompt=add_generation_prompt,
                                            **self._template_kwargs)
        return rendered[0]

    def ends_turn(self, ids: list[int]) -> bool:
        """Whether sampled ids end on the stop token that opens the template's turn closing (e.g. `<|im_end|>`)."""
        return bool(ids) and ids[-1] in self.stop_ids and bool(self.closing_stop) and \
            self.tokenizer.convert_ids_to_tokens(ids[-1]) == self.closing_stop

    def encode(self, text: str) -> list[int]:
        # The fast tokenizer's own encoder when there is one: the same ids, without transformers' per-call checks.
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        return backend.encode(text, add_special_tokens=False).ids if backend else \
            self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    # Incremental bridges are compared with full ones this many times per renderer before they are trusted.
    INCREMENTAL_CHECKS = 16

    def bridge(self, history: list[Message], reply: Message, new: list[Message], tools: list[dict] | None,
               ended_with_eos: bool) -> tuple[list[int], str | None]:
        """Tokens that follow the model's sampled reply: the turn's closing plus the new messages.

        Returns (ids, problem); problem is None when the template is prefix-consistent here.

        Rendered incrementally: only the turns since the last user message (with a leading system message,
        which templates treat apart) are rendered, not the whole conversation twice per turn, so a turn costs the
        same at turn 20 as at turn 2. The first `INCREMENTAL_CHECKS` bridges of a renderer are also rendered in
        full and compared; a template whose new turns render differently in the short context (it looks further
        back) is rendered in full from then on. The token audit (`audit_tokens`) checks every row either way.
        """
        context = recent_context(history) if self.incremental else history
        result = self._bridge(context, reply, new, tools, ended_with_eos)
        if self.incremental and len(context) < len(history) and self._checks_left > 0:
            self._checks_left -= 1
            full = self._bridge(history, reply, new, tools, ended_with_eos)
            if full != result:
                self.incremental = False
                return full
        return result

    def _bridge(self, history: list[Message], reply: Message, new: list[Message], tools: list[dict] | None,
                ended_with_eos: bool) -> tuple[list[int], str | None]:
        before = self.render(history + [reply], tools, add_generation_prompt=False)
        after = self.render(history + [reply] + new, tools, add_generation_prompt=True)
        closing = self.turn_closing
        if ended_with_eos and self.closing_stop:
            closing = closing[len(self.closing_stop):]  # the model already sampled the end-of-turn token
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


def recent_context(history: list[Message]) -> list[Message]:
    """The part of a conversation a turn's bridge is rendered after: a leading system message (templates render
    it, and the tools, apart) and everything from the last user message on. The whole history when it has no
    user message after the system one."""
    head = history[:1] if history and history[0]["role"] == "system" else []
    last_user = next((i for i in range(len(history) - 1, len(head) - 1, -1) if history[i]["role"] == "user"), None)
    return history if last_user is None else head + history[last_user:]


RESERVED_KWARGS = ("conversation", "messages", "tools", "tokenize", "add_generation_prompt")


def check_chat_template_kwargs(kwargs: Any, setting: str = "chat_template_kwargs") -> dict[str, Any]:
    """The kwargs as a dict; ChatFormatError in one line when they are not a JSON object of template variables."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ChatFormatError(f"{setting} must be a JSON object of chat template variables, e.g. "
                         f'{{"enable_thinking": false}}; got {json.dumps(kwargs, default=str)[:80]}', setting=setting)
    taken = [k for k in kwargs if k in RESERVED_KWARGS]
    if taken:
        raise ChatFormatError(f"{setting} sets {', '.join(taken)}, which hubgym sets on every render; remove "
                         f"{'it' if len(taken) == 1 else 'them'}", setting=setting)
    try:
        json.dumps(kwargs)
    except (TypeError, ValueError):
        raise ChatFormatError(f"{setting} must hold only JSON values (strings, numbers, booleans, lists, objects), "
                         f"so the run can record them", setting=setting) from None
    return dict(kwargs)


CHAT_OPTIONS = ("tool_parser", "reasoning_parser", "chat_template_kwargs")


def recorded_chat_options(row: dict[str, Any]) -> dict[str, Any] | None:
    """The chat options in a row's provenance (its `sampling` JSON); None when the row records no sampling."""
    text = (row.get("provenance") or {}).get("sampling")
    if not text:
        return None
    try:
        sampling = json.loads(text)
    except ValueError:
        return None
    return recorded_options({k: sampling.get(k) for k in CHAT_OPTIONS})


def recorded_tools(row: dict[str, Any]) -> list[dict] | None:
    """The tool schemas a row's prompt was rendered with, as its run recorded them (`tools` in its provenance's
    sampling JSON): a run that offered tools hubgym's registry does not make (TRL's, with the env's step as the tool
    `act`) records them. None when the row records none."""
    text = (row.get("provenance") or {}).get("sampling")
    if not text or '"tools"' not in text:
        return None
    try:
        tools = json.loads(text).get("tools")
    except (ValueError, AttributeError):
        return None
    return tools if isinstance(tools, list) and all(isinstance(t, dict) for t in tools) and tools else None


def recorded_options(options: dict[str, Any]) -> dict[str, Any]:
    """Chat options as runs record them: those at their defaults (hermes, no reasoning parser, no kwargs) left out."""
    return {k: v for k, v in options.items() if k in CHAT_OPTIONS and v not in (None, {}, HERMES)}


def stop_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids vLLM stops a reply on: the tokenizer's eos plus generation_config.json's eos_token_id(s)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config = Path(getattr(tokenizer, "name_or_path", "") or ".") / "generation_config.json"
    if config.is_file():
        try:
            eos = json.loads(config.read_text()).get("eos_token_id")
        except (OSError, ValueError):
            eos = None
        ids |= set(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    return frozenset(ids)


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


def audit_tokens(row: dict[str, Any], renderer: ChatRenderer, tools: list[dict] | None = None,
                 own: Any = None) -> TokenAudit:
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
    the loop made them (`own`: the env's own tools, an EnvTools, looked up first). The first stored token that
    does not match is reported.
    """
    ids = list(row["prompt_ids"]) + list(row["completion_ids"])
    if not ids:
        return TokenAudit(0)
    vocabulary = len(renderer.tokenizer)
    outside = next((i for i, token in enumerate(ids) if not 0 <= token < vocabulary), None)
    if outside is not None:  # no template renders it, and the tokenizer cannot decode it
        turn, part = _turn_of(row, outside)
        return TokenAudit(len(ids), outside, turn, part, f"token id {ids[outside]}",
                          f"an id of the tokenizer's {vocabulary}")
    renderer = renderer.for_row(row)
    tools = tools if tools is not None else _tools(row, own)
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
        offered = tools if row["interaction"]["tools"] or recorded_tools(row) else None
        if not _loop_reading(text, offered, message, renderer):
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
    """A turn's sampled ids without the stop token it ended on (not part of the reply's text)."""
    return ids[:-1] if ids and ids[-1] in renderer.stop_ids else ids


def _decode_pieces(ids: list[int], runs: list[tuple[int, int]], replies: list[str], renderer: ChatRenderer) -> str:
    """The stored ids decoded piece by piece, each reply as its text (without an incomplete last character)."""
    pieces, at = [], 0
    for (start, end), text in zip(runs, replies):
        kept = len(_reply_ids(ids[start:end], renderer))
        pieces += [_decode(renderer, ids[at:start]), text, _decode(renderer, ids[start + kept:end])]
        at = end
    return "".join(pieces) + _decode(renderer, ids[at:])


def _loop_reading(text: str, tools: list[dict] | None, message: Message, renderer: ChatRenderer) -> bool:
    """Whether `message` is what the loop makes of a reply that reads `text` (through the renderer's parser)."""
    parsed = renderer.parser.parse(text, "call", tools)
    if message.get("reasoning") != parsed.reasoning:
        return False
    if not tools:
        return (message["content"] or "") == parsed.content and not message.get("tool_calls")
    calls = [_call_key(c) for c in parsed.calls] == [_call_key(c) for c in message.get("tool_calls") or []]
    return calls and (message["content"] or "").strip() == parsed.content.strip()


def _call_key(call: dict[str, Any]) -> str:
    """A tool call's name and arguments, the arguments as parsed JSON where they are JSON (spelling aside)."""
    try:
        arguments = json.dumps(json.loads(call["arguments"]), sort_keys=True)
    except (TypeError, ValueError):
        arguments = call["arguments"]
    return f"{call['name']}({arguments})"


def _tools(row: dict[str, Any], own: Any = None) -> list[dict] | None:
    """The tool schemas the loop rendered into the prompt: those the run recorded, else made from the row's tool
    names (`own`: the env's own tools, looked up first)."""
    recorded = recorded_tools(row)
    if recorded is not None:
        return recorded
    if not row["interaction"]["tools"]:
        return None
    from hubgym.tools.modules import NO_TOOLS
    from hubgym.tools.registry import make_toolbox

    task = {"id": row["task_id"], "env": row["env"], "prompt": row["prompt"], "info": row["info"],
            "interaction": row["interaction"]}
    return make_toolbox(row["interaction"]["tools"], task, own or NO_TOOLS).schemas()


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
