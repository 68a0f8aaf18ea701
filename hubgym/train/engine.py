"""The policy on DeepSpeed: a Hugging Face causal LM, ZeRO-2/3, a torch AdamW, one optimizer step at a time.

    policy = Policy("model_dir", OptimSettings(lr=2e-3, zero_stage=2))
    stats = policy.train_step(micro_batches, loss_fn)     # this rank's share of one global step

One process needs no launcher: the rendezvous variables are set here when absent (on a CPU,
DeepSpeed then picks gloo). Under `deepspeed` or `torchrun` each rank gets its share of the step.

Why the step is driven by hand: the number of micro-batches varies from step to step (token
budget), so DeepSpeed's fixed gradient accumulation cannot apply. Every micro-batch is one
`backward(scale_wrt_gas=False)`, the last one marks the accumulation boundary, then one `step()`.
The losses are already divided by the global batch's counts, so the sum over micro-batches is
the objective; DeepSpeed averages gradients over ranks, which `world_size` undoes.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from hubgym.train.batch import MicroBatch

LossFn = Callable[[torch.nn.Module, MicroBatch], tuple[torch.Tensor, dict[str, float]]]


@dataclass
class OptimSettings:
    lr: float = 2e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    zero_stage: int = 2
    bf16: str = "auto"  # "auto" | "true" | "false"
    gradient_checkpointing: bool = False
    seed: int = 0


@dataclass
class StepStats:
    loss: float
    grad_norm: float | None
    lr: float
    tokens: int  # real tokens forwarded on this rank
    micro_batches: int
    skipped: bool  # a non-finite loss: no weight changed
    seconds: float
    metrics: dict[str, float]


def init_distributed() -> tuple[int, int]:
    """(rank, world size); sets the single-process rendezvous variables when no launcher did."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path("~/.cache/hubgym/torch_extensions").expanduser()))
    import deepspeed

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def bf16_enabled(setting: str) -> bool:
    if setting in ("true", "false"):
        return setting == "true"
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()  # on CPUs fp32 is faster for tiny models


class Policy:
    def __init__(self, model_dir: str | Path, settings: OptimSettings):
        import deepspeed
        from transformers import AutoModelForCausalLM

        self.rank, self.world_size = init_distributed()
        self.settings, self.model_dir = settings, Path(model_dir)
        torch.manual_seed(settings.seed)
        dtype = torch.bfloat16 if bf16_enabled(settings.bf16) else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=settings.betas,
                                      weight_decay=settings.weight_decay)
        config = {
            "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "gradient_clipping": settings.max_grad_norm, "steps_per_print": 1 << 30,
            "zero_optimization": {"stage": settings.zero_stage},
            "bf16": {"enabled": dtype == torch.bfloat16}, "wall_clock_breakdown": False,
        }
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self.dtype = dtype

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def train_step(self, micro_batches: list[MicroBatch], loss_fn: LossFn) -> StepStats:
        """Forward/backward over this rank's micro-batches, then one optimizer step (or a skip)."""
        started = time.perf_counter()
        self.engine.train()
        total, tokens, skipped, merged = 0.0, 0, False, {}
        for i, batch in enumerate(micro_batches):
            batch = batch.to(self.device)
            loss, metrics = loss_fn(self.engine, batch)
            skipped |= self._any_rank(not torch.isfinite(loss).item())
            if skipped:  # keep the collectives of every rank in step, but let no value through
                loss = sum(p.sum() for p in self.engine.module.parameters() if p.requires_grad) * 0.0
            self.engine.set_gradient_accumulation_boundary(i == len(micro_batches) - 1)
            self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
            total += float(loss.detach())
            tokens += batch.tokens
            for k, v in metrics.items():
                merged.setdefault(k, []).append(v)
        lr = self.settings.lr
        if skipped:
            self._set_lr(0.0)  # AdamW moves no weight with lr 0 (weight decay is scaled by lr too)
        self.engine.step()
        self._set_lr(lr)
        grad_norm = self.engine.get_global_grad_norm()
        grad_norm = float(grad_norm) if grad_norm is not None else None
        return StepStats(loss=float("nan") if skipped else self._sum_ranks(total), grad_norm=None if skipped else grad_norm, lr=lr, tokens=tokens,
                         micro_batches=len(micro_batches), skipped=skipped, seconds=time.perf_counter() - started,
                         metrics={k: _reduce(k, v) for k, v in merged.items()})

    @torch.no_grad()
    def forward_logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """Token logprobs of the current weights [B, T-1] (no gradient): proximal / reference policy."""
        from hubgym.train.loss import token_logprobs

        self.engine.eval()
        logprobs, _ = token_logprobs(self.engine, batch.to(self.device))
        return logprobs

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full fp32 weights with Hugging Face names (gathered under ZeRO-3); on every rank."""
        if self.settings.zero_stage == 3:
            import deepspeed

            params = list(self.engine.module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {k: v.detach().clone().float().cpu() for k, v in self.engine.module.state_dict().items()}
        return {k: v.detach().clone().float().cpu() for k, v in self.engine.module.state_dict().items()}

    def export_hf(self, folder: str | Path) -> Path:
        """A Hugging Face model folder (weights, config, tokenizer, chat template) that vLLM loads."""
        import shutil

        from safetensors.torch import save_file

        folder = Path(folder)
        state = self.full_state_dict()
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            if getattr(self.module.config, "tie_word_embeddings", False):
                state.pop("lm_head.weight", None)  # tied: stored once, as transformers does
            save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
                      metadata={"format": "pt"})
            self.module.config.save_pretrained(folder)
            for src in self.model_dir.iterdir():  # tokenizer files and chat template travel with the weights
                if src.is_file() and src.suffix in (".json", ".jinja", ".txt", ".model") and src.name not in (
                        "config.json", "model.safetensors.index.json"):
                    shutil.copy2(src, folder / src.name)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        return folder

    def _set_lr(self, lr: float) -> None:
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def _any_rank(self, flag: bool) -> bool:
        if self.world_size == 1:
            return flag
        value = torch.tensor([float(flag)])
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item())

    def _sum_ranks(self, value: float) -> float:
        if self.world_size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())


def _reduce(name: str, values: list[float]) -> float:
    """Merge one metric over micro-batches: maxima stay maxima, counts add up, the rest is a mean."""
    if name.endswith(("_max", "/max")):
        return max(values)
    if name.endswith(("tokens", "_count", "sequences")):
        return sum(values)
    return sum(values) / len(values)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shutdown() -> None:
    """Tear down the process group (a rare abort at interpreter exit happens without it)."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def state_summary(policy: Policy) -> dict[str, Any]:
    return {"zero_stage": policy.settings.zero_stage, "dtype": str(policy.dtype), "world_size": policy.world_size}
