"""LoRA through peft: only the adapters train; vLLM, exports and the reference see plain Hugging Face weights.

    model = wrap_lora(model, LoraSettings(r=16, alpha=32, target_modules=("q_proj", "v_proj")))
    for name, tensor in merged_weights(model, gather):    # base names, W + scale * B @ A per target module
        ...
    with adapters_disabled(model): ...                    # the base model (the KL reference for free)

Why merge on the fly instead of `merge_and_unload`: the trained adapter must stay as it is (the next
step trains it further), and vLLM's reload path stays the one of full fine-tuning: it gets the
base model's parameter names and full weights, so nothing in vLLM knows about LoRA (no LoRA
kernels, no adapter slots, no max rank). The delta is peft's own `get_delta_weight` (it knows
fan-in/fan-out layouts and rank-stabilised scaling), computed one module at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from hubgym.train.config import ConfigError

PEFT_PREFIX = "base_model.model."
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    r: int = 0  # 0 = no LoRA (full fine-tuning)
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ALL_LINEAR


def wrap_lora(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """The peft model around `model`: base weights frozen, adapters (B = 0 at first) trainable."""
    from peft import LoraConfig, get_peft_model

    targets = list(settings.target_modules)
    _check_targets(model, targets)
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=targets, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def _check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Every target must name some linear module (peft matches a name or its dotted suffix): a typo would
    silently leave that module untrained."""
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise ConfigError(f"lora.target_modules {missing} match no linear module of this model, whose linear "
                          f"modules are {linear}; set lora.target_modules to names from that list, e.g. "
                          f"[{', '.join(n for n in linear if n != 'lm_head')}]")


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def base_name(name: str) -> str:
    """A peft parameter name as the base model's Hugging Face checkpoint spells it."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


GatherFn = Callable[[list[torch.nn.Parameter]], contextlib.AbstractContextManager]


def merged_weights(model: torch.nn.Module, gather: GatherFn) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, weight) for every base parameter and buffer of the state dict, adapters merged in.

    `gather(params)` makes the parameters whole for the duration (ZeRO-3's GatheredParameters; a no-op
    context otherwise); one module's weights are whole at a time. The tensors yielded are fresh
    (never views of the live weights), so a caller may keep them while training goes on.
    """
    from peft.tuners.lora import LoraLayer

    adapter = model.active_adapter if isinstance(model.active_adapter, str) else model.active_adapter[0]
    lora_modules = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if ".lora_" in name:
            continue
        owner = name.rsplit(".", 2)[0] if ".base_layer." in name else None
        module = lora_modules.get(owner) if owner else None
        if module is not None and name.endswith("base_layer.weight"):
            params = [tensor, module.lora_A[adapter].weight, module.lora_B[adapter].weight]
            with gather(params), torch.no_grad():
                merged = tensor.detach().float() + module.get_delta_weight(adapter).float()
            yield base_name(name), merged.to(tensor.dtype)
        else:
            with gather([tensor]), torch.no_grad():
                yield base_name(name), tensor.detach().clone()


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model for the duration (peft's disable_adapter), e.g. the reference of the KL term."""
    with model.disable_adapter():
        yield
