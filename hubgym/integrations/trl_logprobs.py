"""Sampling logprobs of TRL's transformers generation, read as they are made, and laid out on the token record.

TRL 1.16 returns the sampled tokens' logprobs only when vLLM generates (`use_vllm`). Its default path calls
`model.generate` and keeps none, although every one of them was computed: each decoding step's forward pass
returns the logits the next token is drawn from. `LogprobTap` is a forward hook on the model, active only while
one `_generate_single_turn` call runs, that holds each step's logits until the next step's input (the token just
sampled) says which entry to take, and reduces many steps at a time: no extra forward pass, and at most HELD_BYTES
of logits held. These are the raw model distribution's logprobs (before temperature, top-k/p
and other processing), as vLLM reports logprobs by default and as hubgym's own rollouts store them.

The tap checks itself: the tokens its gathers used must be the tokens TRL returns, row by row, or it gives no
logprobs for that row (never a guess). `splice` puts the logprobs of TRL's tool loop (one generate call per turn)
where their tokens sit in the final completion (0.0 at tool and env tokens, as hubgym stores them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch


HELD_BYTES = 64 << 20  # logits held before they are reduced in one call (a few steps of a large vocabulary)


class LogprobTap:
    """`with LogprobTap(model) as tap: ids = generate(...)`, then `tap.logprobs(ids)`: one list per row (None for a
    row the tap cannot vouch for).

    A decoding step costs the hook two tensor views and a list append: each step's logits (B, V) are held, with the
    token the next step says was sampled from them, and reduced to logprobs many steps at a time (one stack and one
    cross-entropy call over all of them) when HELD_BYTES of them are held, and at the end. Per-step reductions cost
    a small model a tenth of its generation time in call overhead; batched ones a fraction of that."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._chunks: list[torch.Tensor] = []  # (K, B) logprobs of reduced steps, on the device
        self._tokens: list[torch.Tensor] = []  # (B,) the token each step sampled (the next step's input)
        self._held: list[torch.Tensor] = []  # (B, V) logits of steps whose token is known, not reduced yet
        self._held_bytes = 0
        self._pending: torch.Tensor | None = None  # (B, V) the last step's logits: its token is not known yet
        self._handle = None
        self.failed = False
        self.seconds = 0.0  # spent in the hook: the tap's own cost on the generation's path

    def __enter__(self) -> LogprobTap:
        self._handle = self.model.register_forward_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()

    def _hook(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        started = time.perf_counter()
        try:
            self._read(args, kwargs, output)
        finally:
            self.seconds += time.perf_counter() - started

    def _read(self, args: tuple, kwargs: dict, output: Any) -> None:
        logits = getattr(output, "logits", None)
        ids = kwargs.get("input_ids", args[0] if args else None)
        if logits is None or ids is None or self.failed:
            self.failed = True
            return
        if self._pending is not None:  # this step's input is the token sampled from the last step's logits
            self._held.append(self._pending)
            self._tokens.append(ids[:, -1])
            self._held_bytes += self._pending.numel() * self._pending.element_size()
            if self._held_bytes >= HELD_BYTES:
                self._reduce()
        self._pending = logits[:, -1, :]  # (B, V), kept as it is (generate copies what it processes)

    def _reduce(self) -> None:
        """The held steps' logprobs, in one call: (K, B, V) logits at their (K, B) tokens."""
        if not self._held:
            return
        tokens = torch.stack(self._tokens[-len(self._held):]).to(self._held[0].device)  # (K, B)
        self._chunks.append(_logprobs(torch.stack(self._held), tokens))  # (K, B)
        self._held, self._held_bytes = [], 0

    def logprobs(self, completion_ids: list[list[int]]) -> list[list[float] | None]:
        """Each row's logprobs for its returned ids; None where the tokens the tap saw are not those ids."""
        rows = len(completion_ids)
        if self.failed or self._pending is None or self._pending.size(0) != rows:
            return [None] * rows
        self._reduce()
        steps = len(self._tokens) + 1  # tokens sampled: the last one's logits are still pending
        device = self._pending.device
        last = torch.tensor([ids[-1] if len(ids) == steps else 0 for ids in completion_ids], device=device)
        final = _logprobs(self._pending[None], last[None])  # (1, B)
        values = torch.cat([*self._chunks, final]).T.cpu()  # (B, T)
        tokens = torch.stack([*(t.to(device) for t in self._tokens), last], dim=1).cpu()  # (B, T)
        out: list[list[float] | None] = []
        for i, ids in enumerate(completion_ids):
            n = len(ids)
            ok = n <= steps and tokens[i, :n].tolist() == list(ids)
            out.append(values[i, :n].tolist() if ok else None)
        return out


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(K, B) log-softmax of `logits` (K, B, V) at `tokens` (K, B): minus the tokens' cross-entropy, one call."""
    k, b, v = logits.shape
    with torch.no_grad():
        flat = -torch.nn.functional.cross_entropy(logits.reshape(k * b, v).float(), tokens.reshape(k * b),
                                                  reduction="none")
    return flat.reshape(k, b)


@dataclass
class GenerateCall:
    """One `_generate_single_turn` call: its prompts, what it returned, and the tapped logprobs per row."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float] | None]
    _by_prompt: dict[tuple[int, ...], list[int]] = field(default_factory=dict, repr=False)

    def rows_for(self, prompt: list[int]) -> list[int]:
        """Indices of this call's rows whose prompt is `prompt` (a tool-loop call continues some rows only)."""
        if not self._by_prompt:
            for i, ids in enumerate(self.prompt_ids):
                self._by_prompt.setdefault(tuple(ids), []).append(i)
        return self._by_prompt.get(tuple(prompt), [])


def splice(calls: list[GenerateCall], row: int, prompt_ids: list[int], completion_ids: list[int],
           mask: list[int]) -> list[float] | None:
    """Row `row`'s logprobs on its final completion: each run of model tokens (mask 1) is the output of one generate
    call, in order (the first call made every row's first turn; each tool-loop call continues the rows that called a
    tool, from their prompt and completion so far). 0.0 at tool/env tokens; None when a run is not found or a tapped
    row could not be vouched for."""
    out = [0.0] * len(completion_ids)
    for turn, (start, end) in enumerate(_runs(mask)):
        if turn >= len(calls):
            return None
        call = calls[turn]
        if turn == 0:
            candidates = [row] if row < len(call.completion_ids) else []
        else:
            candidates = call.rows_for(prompt_ids + completion_ids[:start])
        run = completion_ids[start:end]
        found = next((call.logprobs[i] for i in candidates
                      if call.logprobs[i] is not None and call.completion_ids[i][:len(run)] == run), None)
        if found is None:
            return None
        out[start:end] = found[:len(run)]
    return out


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    runs: list[list[int]] = []
    for j, m in enumerate(mask):
        if m and (j == 0 or not mask[j - 1]):
            runs.append([j, j + 1])
        elif m:
            runs[-1][1] = j + 1
    return [(a, b) for a, b in runs]
