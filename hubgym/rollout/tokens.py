"""One token sequence per trajectory, extended turn by turn, never re-tokenized.

The model's sampled ids (mask 1, with the engine's logprobs) are kept as sampled. Between
turns, the tokens of tool results and environment observations (mask 0, logprob 0.0) are the
chat template's rendering of those messages: the text the template adds after the history.
That is only sound when the template is *prefix-consistent*: rendering the history plus new
messages must start with the rendering of the history. Templates that rewrite earlier turns
(e.g. strip earlier reasoning) break it; the record then says so (`consistent = False`).
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


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
