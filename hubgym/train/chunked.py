"""Next-token logprobs straight from the final hidden states and the output weight, a chunk of tokens at a
time, so that no (tokens, vocabulary) float32 logits tensor is ever held whole.

    head = output_head(model)                        # None: a model whose logits must be taken as they are
    hidden = head.hidden_states(batch)               # (B, T, H), the decoder's output before the output layer
    logp, entropy = chunked_logprobs(h, head.weight, targets, with_entropy=True)   # (N,) each; logp has a gradient
    loss, logp, entropy = fused_token_loss(h, head.weight, targets, token_loss)    # gradients made in the forward

At N loss tokens and a vocabulary of V, a float32 (N, V) tensor is 8 GiB at N = 14k, V = 152k (Qwen2's
vocabulary), and the plain loss holds several of them (the logits, their float32 copy, log-softmax and
its gradient). Here a chunk of `rows` tokens is projected, normalized and differentiated, then dropped:
peak memory is O(rows x V), whatever N.

Two ways, one set of numbers:
- chunked_logprobs: an autograd Function returning logprobs (N,); its backward recomputes each chunk's
  logits (one more (rows, H) x (H, V) product per chunk), so any loss may follow it.
- fused_token_loss: the loss is a sum of per-token terms (hubgym.train.loss: every GRPO term of a token
  depends on that token's logprob alone, and the aggregation is linear), so each chunk's d loss / d logp
  is known as soon as its logprobs are: the gradients w.r.t. the hidden states and the output weight are
  made in the forward, chunk by chunk (as Liger's fused linear cross-entropy does), and the backward only
  hands them on. Three products per chunk, as the unfused output layer has.

The gradient of logp_t = x_t[y_t] - logsumexp(x_t) with x_t = W h_t is, for an upstream gradient g_t:
    d/dx_t = g_t (onehot(y_t) - softmax(x_t)),   d/dh_t = (d/dx_t) W,   d/dW = sum_t (d/dx_t)^T h_t
and the entropy metric H_t = logsumexp(x_t) - sum_v softmax(x_t)_v x_tv has no gradient.

Under DeepSpeed ZeRO-3 the output weight is a shard outside its module's forward: `OutputHead.run` calls
the model through its DeepSpeed engine with the forward redirected to the given function, and the output
layer through its own module call, so ZeRO-3's hooks gather (and release) its weight as they do for the
model's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

# Elements of one chunk's float32 logits: 128 Mi = 512 MiB (3,400 rows of a 152k vocabulary; all of a tiny one).
CHUNK_ELEMENTS = 1 << 27
MIN_ROWS = 128


def chunk_rows(vocab: int) -> int:
    """Tokens per chunk: as many as CHUNK_ELEMENTS logits allow (large chunks keep the products efficient)."""
    return max(MIN_ROWS, CHUNK_ELEMENTS // max(1, vocab))


# -- logprobs with a gradient through a recomputing backward --------------------------------------

class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, rows, with_entropy):  # hidden (N, H), weight (V, H), targets (N,)
        logp = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        entropy = hidden.new_empty(hidden.shape[0], dtype=torch.float32) if with_entropy else None
        for start in range(0, hidden.shape[0], rows):
            part = slice(start, start + rows)
            logits = _logits(hidden[part], weight)  # (rows, V) float32
            lse = torch.logsumexp(logits, -1)
            logp[part] = logits.gather(-1, targets[part, None]).squeeze(-1) - lse
            if entropy is not None:
                entropy[part] = _entropy(logits, lse)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.rows = rows
        if entropy is None:
            return logp, logp.new_zeros(0)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], ctx.rows):
            part = slice(start, start + ctx.rows)
            logits = _logits(hidden[part], weight)
            _accumulate(logits, grad_logp[part], targets[part], hidden[part], weight, part, grad_hidden, grad_weight)
        return grad_hidden, _as(grad_weight, weight), None, None, None


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                     with_entropy: bool = False, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logprob of `targets` (N,) under softmax(hidden @ weight.T), float32, and the entropy (no gradient) when asked.

    hidden (N, H) and weight (V, H) as the model holds them (bf16 on a GPU: the products run in it, as the
    model's own output layer's do; the normalization is float32)."""
    logp, entropy = _ChunkedLogprobs.apply(hidden, weight, targets, rows or chunk_rows(weight.shape[0]), with_entropy)
    return logp, entropy if with_entropy else None


def liger_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """chunked_logprobs' values from Liger-Kernel's fused linear cross-entropy (per-token NLL and entropy: on an
    H100 its SM90 kernel, elsewhere its own chunked PyTorch; its backward recomputes, as chunked_logprobs'
    does). `loss.output_layer: liger`; `pip install 'hubgym[gpu]'` brings it."""
    from liger_kernel.ops import LigerFusedLinearScaledCrossEntropyFunction as Liger

    try:
        if not with_entropy:
            return -Liger.apply(hidden, weight, targets), None
        nll, entropy = Liger.apply(hidden, weight, targets, return_entropy=True)
    except ImportError as exc:  # an H100's kernel is written in CUTLASS's Python DSL, an extra of its own
        raise ImportError(f"loss.output_layer=liger: Liger-Kernel's kernel for this GPU cannot load ({exc}); "
                          "pip install 'liger-kernel[cutedsl]', or use loss.output_layer=fused") from exc
    return -nll, entropy.detach()


# -- a loss whose gradients are made in the forward --------------------------------------------------

TokenLoss = Callable[[torch.Tensor, slice], torch.Tensor]  # (logp of the tokens in `part`, part) -> summed loss


class _FusedTokenLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, token_loss, rows, with_entropy):
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32) if with_entropy else logp.new_zeros(0)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        total = logp.new_zeros(())
        for start in range(0, n, rows):
            part = slice(start, min(start + rows, n))
            logits = _logits(hidden[part], weight)  # (rows, V) float32
            lse = torch.logsumexp(logits, -1)
            logp[part] = logits.gather(-1, targets[part, None]).squeeze(-1) - lse
            if with_entropy:
                entropy[part] = _entropy(logits, lse)
            with torch.enable_grad():  # the token terms of this chunk, differentiated w.r.t. its logprobs only
                leaf = logp[part].detach().requires_grad_()
                value = token_loss(leaf, part)
                (grad_logp,) = torch.autograd.grad(value, leaf, allow_unused=True, materialize_grads=True)
            total += value.detach()
            _accumulate(logits, grad_logp, targets[part], hidden[part], weight, part, grad_hidden, grad_weight, lse)
        ctx.save_for_backward(*(t for t in (grad_hidden, grad_weight) if t is not None))
        ctx.has = (grad_hidden is not None, grad_weight is not None)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(logp, entropy)
        return total, logp, entropy

    @staticmethod
    def backward(ctx, grad_total, _grad_logp, _grad_entropy):
        saved = iter(ctx.saved_tensors)
        grad_hidden = next(saved) if ctx.has[0] else None
        grad_weight = next(saved) if ctx.has[1] else None
        scale = grad_total  # 1 under a plain backward of the loss; a scaled loss scales both
        grad_hidden = grad_hidden * scale.to(grad_hidden.dtype) if grad_hidden is not None else None
        grad_weight = (grad_weight * scale).to(ctx.weight_dtype) if grad_weight is not None else None
        return grad_hidden, grad_weight, None, None, None, None


def fused_token_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, token_loss: TokenLoss, *,
                     with_entropy: bool = False, rows: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(loss, logp (N,), entropy (N,) or None): loss = sum over chunks of token_loss(logp[part], part).

    `token_loss` must be a sum of per-token terms, each a function of its own token's logprob (its gradient
    w.r.t. the chunk's logprobs is taken chunk by chunk). logp and entropy carry no gradient (for metrics)."""
    loss, logp, entropy = _FusedTokenLoss.apply(hidden, weight, targets, token_loss,
                                                rows or chunk_rows(weight.shape[0]), with_entropy)
    return loss, logp, entropy if with_entropy else None


# -- pieces -----------------------------------------------------------------------------------------

def _logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(rows, V) in float32: the product in the model's dtype, as its output layer computes it, then upcast."""
    return torch.nn.functional.linear(hidden, weight).float()


def _entropy(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """H = lse - sum_v softmax(x)_v x_v, per row (the logsumexp is the loss's own)."""
    return lse - torch.linalg.vecdot(torch.softmax(logits, -1), logits)


def _accumulate(logits, grad_logp, targets, hidden, weight, part, grad_hidden, grad_weight, lse=None) -> None:
    """The chunk's share of d/dh and d/dW for upstream gradients `grad_logp` (rows,). Overwrites `logits`."""
    if lse is None:
        lse = torch.logsumexp(logits, -1)
    grad_logits = logits.sub_(lse[:, None]).exp_().mul_(-grad_logp[:, None])  # -g softmax(x), in place
    grad_logits.scatter_add_(-1, targets[:, None], grad_logp[:, None].to(grad_logits.dtype))  # + g onehot(y)
    grad_logits = grad_logits.to(weight.dtype)
    if grad_hidden is not None:
        grad_hidden[part] = grad_logits @ weight
    if grad_weight is None:
        return
    if hidden.dtype == torch.float32:
        grad_weight.addmm_(grad_logits.t(), hidden)  # (V, rows) x (rows, H), no temporary
    else:
        grad_weight.add_((grad_logits.t() @ hidden).float())  # the product in the model's dtype, summed in float32


def _as(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    return grad.to(like.dtype) if grad is not None else None


# -- the model's decoder and output layer ----------------------------------------------------------

SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


@dataclass
class OutputHead:
    """A Hugging Face causal LM split at its output layer: `run` calls the model (through its DeepSpeed engine,
    when given one) with its forward replaced by a function of the decoder's hidden states and the head."""

    model: Any  # what was given: a DeepSpeed engine, a peft model, or the causal LM itself
    causal_lm: torch.nn.Module
    head: torch.nn.Linear

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.head.weight

    def hidden_states(self, **inputs) -> torch.Tensor:
        """(B, T, H): the decoder's last hidden state (after its final norm), the output layer's input."""
        return self.causal_lm.get_decoder()(**inputs, use_cache=False).last_hidden_state

    def apply_head(self, fn: Callable[[torch.Tensor], Any], hidden: torch.Tensor) -> Any:
        """fn(weight) called as the output layer's forward, so that ZeRO-3 gathers the weight around it."""
        return _as_forward(self.head, lambda *_: fn(self.head.weight), hidden)

    def run(self, fn: Callable[[], Any]) -> Any:
        """fn() called as the root module's forward: DeepSpeed's engine wraps it as it wraps a model call."""
        root = self.model.module if _is_engine(self.model) else self.model
        return _as_forward(root, lambda *_: fn(), None, caller=self.model)


def output_head(model: Any) -> OutputHead | None:
    """The decoder/head split of a Hugging Face causal LM (behind a DeepSpeed engine or peft), or None when the
    logits are not a plain linear map of the last hidden state (scaled or soft-capped logits, a head with a bias
    or with LoRA adapters, a model that is not a transformers causal LM)."""
    inner = model.module if _is_engine(model) else model
    if hasattr(inner, "get_base_model"):  # peft
        inner = inner.get_base_model()
    getter = getattr(inner, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    config = getattr(inner, "config", None)
    if type(head) is not torch.nn.Linear or head.bias is not None or not callable(getattr(inner, "get_decoder", None)):
        return None
    if config is None or any(getattr(config, key, None) not in (None, 1, 1.0) for key in SCALED_LOGITS):
        return None
    return OutputHead(model, inner, head)


def _is_engine(model: Any) -> bool:
    return type(model).__name__ == "DeepSpeedEngine" or hasattr(model, "zero_optimization_stage")


def _as_forward(module: torch.nn.Module, fn: Callable, argument: Any, caller: Any = None) -> Any:
    """Call `caller` (default: the module) with the module's forward replaced by `fn` for that one call, so the
    module's hooks (DeepSpeed's ZeRO-3 gather and release) run around `fn` as around the module's own forward."""
    had_own = "forward" in module.__dict__
    original = module.__dict__.get("forward")

    def restore() -> None:
        if had_own:
            module.forward = original
        else:
            module.__dict__.pop("forward", None)

    def redirected(*args, **kwargs):
        restore()  # before fn: a nested call of the module runs its real forward
        return fn(*args, **kwargs)

    module.forward = redirected
    try:
        target = caller if caller is not None else module
        return target(argument) if argument is not None else target()
    finally:
        restore()
