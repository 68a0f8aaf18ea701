"""Sampling logprobs of TRL's transformers generation, read as they are made, and laid out on the token record.

TRL 1.16 returns the sampled tokens' logprobs only when vLLM generates (`use_vllm`). Its default path calls
`model.generate` and keeps none, although every one of them was computed: each decoding step's forward pass
returns the logits the next token is drawn from. `LogprobTap` is a forward hook on the model, active only while
one `_generate_single_turn` call runs, that keeps each step's logits until the next step's input (the token just
sampled) says which entry to take: one cross-entropy call a step, no extra forward pass, nothing of size
vocabulary kept past one step. These are the raw model distribution's logprobs (before temperature, top-k/p
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


class LogprobTap:
    """`with LogprobTap(model) as tap: ids = generate(...)`, then `tap.logprobs(ids)`: one list per row (None for a
    row the tap cannot vouch for)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._steps: list[torch.Tensor] = []  # (B,) logprob of the token sampled at each step
        self._tokens: list[torch.Tensor] = []  # (B,) the token each gather used
        self._pending: torch.Tensor | None = None  # (B, V) the last step's log-softmax
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
            token = ids[:, -1:].to(self._pending.device)
            self._steps.append(_logprob(self._pending, token))  # (B,), on the device: no sync per step
            self._tokens.append(token[:, 0])
        self._pending = logits[:, -1, :]  # (B, V), kept as it is (generate copies what it processes)

    def logprobs(self, completion_ids: list[list[int]]) -> list[list[float] | None]:
        """Each row's logprobs for its returned ids; None where the gathered tokens are not those ids."""
        rows = len(completion_ids)
        if self.failed or self._pending is None or self._pending.size(0) != rows:
            return [None] * rows
        steps = len(self._steps) + 1  # tokens sampled: the last one's logits are still pending
        device = self._pending.device
        last = torch.tensor([ids[-1] if len(ids) == steps else 0 for ids in completion_ids], device=device)
        values = torch.stack([*self._steps, _logprob(self._pending, last[:, None])], dim=1).cpu()  # (B, T)
        tokens = torch.stack([*self._tokens, last], dim=1).cpu()  # (B, T)
        out: list[list[float] | None] = []
        for i, ids in enumerate(completion_ids):
            n = len(ids)
            ok = n <= steps and tokens[i, :n].tolist() == list(ids)
            out.append(values[i, :n].tolist() if ok else None)
        return out


def _logprob(logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """(B,) log-softmax of `logits` (B, V) at `token` (B, 1), as one call (minus the cross-entropy of the token): a
    step of a small model costs few more calls than this one."""
    with torch.no_grad():
        return -torch.nn.functional.cross_entropy(logits.float(), token[:, 0], reduction="none")


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
