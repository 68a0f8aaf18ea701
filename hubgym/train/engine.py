"""The policy on DeepSpeed: a Hugging Face causal LM under ZeRO-2/3 with a torch AdamW, one optimizer step at a time.

    policy = Policy("model_dir", DeepSpeedSettings(lr=2e-3, zero_stage=2))
    stats = policy.train_step(micro_batches, loss_fn)   # this rank's share of one global step
    policy.export_hf("out/model")                        # a folder vllm.LLM and transformers load

One process needs no launcher: the rendezvous variables are set here when absent (DeepSpeed then
picks gloo on a CPU, nccl on a GPU). Under `deepspeed` or `torchrun` every rank builds its own
Policy and passes its own share of each step's micro-batches.

How the step is scaled. The losses divide by the counts of the *global* batch (MicroBatch.num_sequences,
num_tokens), so the plain sum of the losses of every micro-batch on every rank is the objective.
DeepSpeed would divide each backward by its gradient-accumulation steps (`scale_wrt_gas=False` turns
that off) and averages gradients over ranks (multiplying each loss by world_size undoes it). The
number of micro-batches may change from step to step (token-budget packing): the last one marks
the accumulation boundary by hand.

How a bad step is skipped. A non-finite loss is turned into NaN gradients on purpose; DeepSpeed's
ZeRO optimizers check the global gradient norm before the update and, when it is not finite
(a NaN loss, or an inf/NaN gradient from a finite loss), drop the gradients and leave weights and
AdamW moments untouched. `engine.was_step_applied()` tells which happened, on every rank alike. A finite
step can still leave weights that are not (a learning rate of inf): `weights_finite` says so, and
`export_hf` refuses to write them.

How the step waits for the device. The losses, their finite checks and the loss's metrics stay on the
device as tensors for the whole step (a non-finite loss is turned into NaN by a multiplication decided
there) and are read in one copy after the optimizer step: the host queues every micro-batch's work
without waiting for the GPU to finish the previous one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from hubgym.files import replace_dir
from hubgym.train.batch import MicroBatch
from hubgym.train.config import ConfigError
from hubgym.train.lora import LoraSettings, is_lora, merged_weights, wrap_lora
from hubgym.train.metrics import merge_metrics, read_metrics, read_numbers
from hubgym.train.ops import load_deepspeed_ops, release_shm_names
from hubgym.train.schedule import SCHEDULES, Schedule, make_scheduler

LossFn = Callable[[torch.nn.Module, MicroBatch], tuple[torch.Tensor, dict[str, float]]]
SKIP_LOSS, SKIP_GRAD = "non-finite loss", "non-finite gradient norm"
DIST_TIMEOUT_S = 1800.0  # torch's own default: rank 0 may sample with vLLM this long while the others wait


@dataclass
class DeepSpeedSettings:
    """How the policy trains: ZeRO stage, precision, AdamW, clipping, accumulation."""

    zero_stage: int = 2  # 2: optimizer state + gradients sharded; 3: weights too
    bf16: str = "auto"  # auto (bf16 where the GPU supports it, fp32 on CPUs) | true | false
    lr: float = 2e-3  # AdamW peak learning rate
    schedule: str = "constant"  # constant | linear | cosine (hubgym.train.schedule)
    warmup_steps: int = 0  # linear warmup over this many updates
    total_steps: int = 0  # updates of the whole run: where linear/cosine decay ends
    min_lr_ratio: float = 0.0  # the decay's floor as a fraction of lr
    lora: LoraSettings = field(default_factory=LoraSettings)  # r = 0: full fine-tuning
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # clip the global gradient norm to this; 0 = no clipping
    gradient_checkpointing: bool = False  # recompute activations in backward: memory for time
    compile: bool = False  # the decoder under torch.compile (compile_decoder)
    micro_batches: int = 0  # micro-batches per rank per step (gradient accumulation); 0 = any (token packing)
    seed: int = 0  # torch seed before the model is built

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # a YAML or JSON config gives a list
        if self.zero_stage not in (2, 3):
            raise ConfigError(f"zero_stage is {self.zero_stage!r}; DeepSpeed ZeRO stage 2 or 3 is supported: "
                              "set optim.zero_stage to 2 (sharded optimizer and gradients) or 3 (weights too)")
        if self.bf16 not in ("auto", "true", "false"):
            raise ConfigError(f"bf16 is {self.bf16!r}; use 'auto', 'true' or 'false'")
        if not self.lr > 0 or self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ConfigError(f"lr={self.lr} must be > 0, weight_decay={self.weight_decay} >= 0 and "
                              f"max_grad_norm={self.max_grad_norm} >= 0 (0 turns clipping off)")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas={self.betas} must be two numbers in [0, 1), e.g. (0.9, 0.999)")
        if self.micro_batches < 0:
            raise ConfigError(f"micro_batches={self.micro_batches} must be >= 0 (0 = as many as the packer makes)")
        if self.schedule not in SCHEDULES or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"schedule={self.schedule!r}, warmup_steps={self.warmup_steps}, min_lr_ratio="
                              f"{self.min_lr_ratio}: use one of {SCHEDULES}, warmup_steps >= 0, min_lr_ratio in [0, 1]")

    def lr_schedule(self) -> Schedule:
        return Schedule(self.schedule, self.warmup_steps, self.total_steps, self.min_lr_ratio)




@dataclass
class StepStats:
    """What one optimizer step did, the same on every rank (`metrics`: the loss's, token-weighted over every
    micro-batch of every rank by merge_metrics)."""

    loss: float  # the objective: sum of the losses of every micro-batch on every rank
    grad_norm: float | None  # global gradient norm before clipping; None when the step was skipped
    lr: float
    tokens: int  # real (non-pad) tokens forwarded, all ranks
    micro_batches: int  # on this rank
    skipped: bool  # True: no weight and no optimizer state changed
    skip_reason: str | None  # SKIP_LOSS or SKIP_GRAD
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)


def init_distributed(timeout_s: float = DIST_TIMEOUT_S) -> tuple[int, int]:
    """(rank, world size). With no launcher (a plain `python script.py`, where DeepSpeed would otherwise look
    for MPI) it starts a one-process group itself, on a port the OS assigns while binding it: picking a free
    port first and binding it later races with every other process starting up on the machine.

    `timeout_s` bounds the rendezvous of launched workers (env://: waiting for the other nodes) and every
    collective after it, under gloo and NCCL alike (hubgym.train.nodes says why 30 minutes). DeepSpeed's CPU op
    is built or loaded first (hubgym.train.ops: never waiting on a build that died), and the names of its
    shared-memory buffers are released once every rank has mapped them (ops.release_shm_names: no run leaves RAM
    behind)."""
    cpu_op = load_deepspeed_ops()
    import deepspeed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # this node's GPU (LOCAL_RANK, not RANK)
    if not torch.distributed.is_initialized():
        _forget_torn_down_group()
    if not _launched() and not torch.distributed.is_initialized():
        port = 0 if _OWN_GROUP else int(os.environ.get("MASTER_PORT", 0))  # our old store may still hold its port
        store = torch.distributed.TCPStore("127.0.0.1", port, 1, True)
        torch.distributed.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
        _OWN_GROUP.clear()
        _OWN_GROUP.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(store.port))
        os.environ.update(_OWN_GROUP)
    if not torch.distributed.is_initialized() or not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        if cpu_op:
            release_shm_names(torch.distributed.get_rank(), torch.distributed.get_world_size())
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


_OWN_GROUP: dict[str, str] = {}  # the launcher variables init_distributed set for a group it started itself


def _launched() -> bool:
    """Whether a launcher (torchrun, deepspeed, a node) set this process's rank, as opposed to init_distributed
    for a one-process group of its own earlier in this process."""
    if "RANK" not in os.environ:
        return False
    return not _OWN_GROUP or any(os.environ.get(k) != v for k, v in _OWN_GROUP.items())


def _forget_torn_down_group() -> None:
    """A group DeepSpeed used was torn down by someone else (an engine core that ran in this process tears down
    torch.distributed's group when it closes): DeepSpeed's backend and its cached groups (a clone of the world
    group, data-parallel groups) point at the dead group. Drop them, as deepspeed.comm.destroy_process_group does,
    so the next group starts clean."""
    import deepspeed.comm.comm as ds_comm
    from deepspeed.utils import groups

    if ds_comm.cdb is not None:
        groups._release_process_group_references(group=None)
        ds_comm.cdb = None


def bf16_enabled(setting: str) -> bool:
    """'auto': bf16 on GPUs that support it; on CPUs fp32 (tiny models run faster, and exactly)."""
    if setting in ("true", "false"):
        return setting == "true"
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def deepspeed_config(settings: DeepSpeedSettings) -> dict[str, Any]:
    """The DeepSpeed config. Batch sizes are bookkeeping only: train_step drives accumulation itself."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": max(1, settings.micro_batches),
        "gradient_clipping": settings.max_grad_norm,
        "zero_optimization": {"stage": settings.zero_stage},
        "bf16": {"enabled": bf16_enabled(settings.bf16)},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def attention_implementation(config: dict[str, Any]) -> str | None:
    """flash-attention 2 where it is installed and the step runs in bf16 on a GPU: its varlen kernel keeps a
    packed row's sequences apart without a mask (pack_step's position ids). Otherwise transformers' default
    (SDPA: a block-diagonal causal mask for a packed row, none for a row of one sequence)."""
    import importlib.util

    usable = torch.cuda.is_available() and config["bf16"]["enabled"] and importlib.util.find_spec("flash_attn")
    return "flash_attention_2" if usable else None


def load_model(model_dir: str | Path, config: dict[str, Any]) -> torch.nn.Module:
    """The causal LM of a Hugging Face folder in float32, partitioned when `config` is ZeRO-3.

    Under ZeRO-3 transformers loads each weight straight into its shard (deepspeed.zero.Init), so no
    rank ever holds the whole model. The switch is process-global: off again once loaded, so other
    models this process loads (a test's, say) load whole.
    """
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    hf_zero3 = HfDeepSpeedConfig(config) if config["zero_optimization"]["stage"] == 3 else None
    try:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                    attn_implementation=attention_implementation(config))
    finally:
        if hf_zero3 is not None:
            unset_hf_deepspeed_config()


def compile_decoder(model: torch.nn.Module) -> None:
    """torch.compile the decoder in place (the part before the output layer, which the loss applies in chunks of
    its own), with dynamic shapes: micro-batches change their rows and width from step to step, and a compile per
    shape would never end. A model without the decoder/head split is compiled whole."""
    from hubgym.train.chunked import output_head

    head = output_head(model)
    (head.causal_lm.get_decoder() if head is not None else model).compile(dynamic=True)


class Policy:
    """A causal LM from a Hugging Face folder, wrapped by `deepspeed.initialize` with a torch AdamW."""

    def __init__(self, model_dir: str | Path, settings: DeepSpeedSettings | None = None):
        import deepspeed

        self.settings = settings = settings or DeepSpeedSettings()
        self.model_dir = Path(model_dir)
        self.rank, self.world_size = init_distributed()
        torch.manual_seed(settings.seed)
        config = deepspeed_config(settings)
        model = load_model(self.model_dir, config)  # fp32 master weights
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        if settings.lora.r:
            model = wrap_lora(model, settings.lora)  # base frozen: ZeRO shards only the adapters' state
        if settings.compile:
            compile_decoder(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=settings.lr, betas=settings.betas,
                                      weight_decay=settings.weight_decay)  # a torch optimizer: no Adam op to compile
        scheduler = make_scheduler(optimizer, settings.lr_schedule())  # DeepSpeed steps and checkpoints it
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                               config=config)
        self.dtype = torch.bfloat16 if config["bf16"]["enabled"] else torch.float32

    @property
    def lora(self) -> bool:
        """Whether only LoRA adapters train (the module is a peft model)."""
        return is_lora(self.module)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def train_step(self, micro_batches: list[MicroBatch], loss_fn: LossFn) -> StepStats:
        """Forward/backward over this rank's micro-batches, then one optimizer step (or a skip).

        Every rank must pass the same number of micro-batches (pad a short rank with one whose
        loss_mask is all 0): each backward takes part in collectives.
        """
        self._check_count(micro_batches)
        started = time.perf_counter()
        self.engine.train()
        lr = self.engine.optimizer.param_groups[0]["lr"]  # this update's (the scheduler moves it in step())
        tokens = sum(batch.tokens for batch in micro_batches)  # counted on the host's copies
        # Every micro-batch's copy is queued at once (from pinned memory on a GPU), its loss index found first.
        moved = [(batch if batch.loss_rows is not None else batch.with_loss_index()).to(self.device)
                 for batch in micro_batches]
        losses, bad = [], []
        per_batch: list[dict[str, torch.Tensor]] = []
        for i, batch in enumerate(moved):
            loss, metrics = loss_fn(self.engine, batch)
            finite = torch.isfinite(loss.detach())
            # A non-finite loss becomes NaN in every gradient it reaches (DeepSpeed then skips the update); a
            # finite one is multiplied by exactly 1. Decided on the device: the host does not wait for it here.
            loss = loss * torch.where(finite, 1.0, float("nan"))
            self.engine.set_gradient_accumulation_boundary(i == len(micro_batches) - 1)
            self.engine.backward(loss * self.world_size, scale_wrt_gas=False)  # undo the mean over ranks
            losses.append(loss.detach())
            bad.append(~finite)
            per_batch.append(metrics)
        self.engine.step()
        # The step's one read from the device: every loss, finite check and metric at once, after the update.
        numbers = read_numbers([torch.stack(losses).sum(), torch.stack(bad).sum()])
        loss_sum, tokens, bad_count = self._sum_over_ranks(numbers[0], tokens, numbers[1])
        applied = self.engine.was_step_applied()
        if bad_count and applied:  # cannot happen with DeepSpeed's ZeRO optimizers; if it did, the weights hold NaN
            raise RuntimeError("a non-finite loss reached the weights: DeepSpeed did not skip the update")
        reason = None if applied else (SKIP_LOSS if bad_count else SKIP_GRAD)
        norm = self.engine.get_global_grad_norm()
        return StepStats(loss=loss_sum, grad_norm=float(norm) if applied and norm is not None else None,
                         lr=lr, tokens=int(tokens),
                         micro_batches=len(micro_batches), skipped=not applied, skip_reason=reason,
                         seconds=time.perf_counter() - started,
                         metrics=merge_metrics(read_metrics(per_batch), self._reduce_over_ranks))

    @torch.no_grad()
    def logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """Logprob of each next token under the current weights, (B, T-1), 0 on padding and where the next token
        starts another sequence of a packed row; no gradient.

        For reference or proximal logprobs. Under ZeRO-3 the forward gathers weights collectively:
        every rank must call it the same number of times.
        """
        from hubgym.train.loss import token_logprobs

        self.engine.eval()
        batch = batch.to(self.device)
        return token_logprobs(self.engine, batch, positions=batch.next_token_positions())[0]  # chunked, no (B,T,V)

    def full_state_dict(self, dtype: torch.dtype | None = torch.float32) -> dict[str, torch.Tensor]:
        """Full weights with Hugging Face names on rank 0 ({} on other ranks), as `dtype`; call it on every rank.

        Under ZeRO-3 each weight is gathered from its shards one at a time, so rank 0 never holds
        more than the full state plus one weight. With LoRA the adapters are merged in (W + scale * B @ A)
        under the base model's names; the adapters themselves are left as they are.
        """
        return {name: tensor for name, tensor in self.named_weights(dtype)}

    def named_weights(self, dtype: torch.dtype | None = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, CPU copy as `dtype`; None: float32) one weight at a time, on rank 0 (nothing
        elsewhere); every rank must iterate it to the end (under ZeRO-3 each weight is gathered collectively)."""
        dtype = dtype or torch.float32
        if self.lora:
            items: Iterator[tuple[str, torch.Tensor]] = merged_weights(self.module, _gather)
        else:
            items = self._plain_weights()
        for name, tensor in items:
            if self.rank == 0:
                yield name, tensor.detach().to("cpu", dtype, copy=True)

    def _plain_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.module.state_dict(keep_vars=True).items():  # keep_vars: ZeRO-3 params to gather
            with _gather([tensor]):
                yield name, tensor

    def export_hf(self, folder: str | Path) -> Path:
        """Write a Hugging Face model folder (safetensors, config, tokenizer, chat template); call on every rank.

        Written beside `folder` and renamed into place, so a reader sees the previous export or this
        one, never half of one. vllm.LLM and transformers load it as they load `model_dir`.
        """
        from safetensors.torch import save_file

        folder = Path(folder)
        if not self.weights_finite():  # a model of NaN loads everywhere and answers nothing
            from hubgym.errors import NonFiniteTrainingError

            raise NonFiniteTrainingError(f"not exporting {folder}: a weight is not a finite number after "
                                         f"{self.engine.global_steps} step(s); lower optim.lr (now "
                                         f"{self.settings.lr:g}) or clip harder (optim.max_grad_norm)")
        state = self.full_state_dict()
        if self.rank == 0:
            staging = folder.with_name(f".{folder.name}.partial")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            if getattr(self.module.config, "tie_word_embeddings", False):
                state.pop("lm_head.weight", None)  # tied: stored once, as transformers does
            save_file({k: v.contiguous() for k, v in state.items()}, str(staging / "model.safetensors"),
                      metadata={"format": "pt"})
            self.module.config.save_pretrained(staging)
            _copy_side_files(self.model_dir, staging)
            (staging / "hubgym_export.json").write_text(json.dumps({"source": self.model_dir.name,
                                                                    "global_steps": self.engine.global_steps}))
            replace_dir(staging, folder)
        _barrier()
        return folder

    def _check_count(self, micro_batches: list[MicroBatch]) -> None:
        expected = self.settings.micro_batches
        if not micro_batches:
            raise ConfigError(f"train_step got no micro-batch on rank {self.rank}; every rank needs at least one: "
                              "give a rank without rows one whose loss_mask is all 0")
        if expected and len(micro_batches) != expected:
            raise ConfigError(f"train_step got {len(micro_batches)} micro-batches on rank {self.rank} and "
                              f"DeepSpeedSettings.micro_batches is {expected}: pack {expected} per rank, or set "
                              "micro_batches=0 to accept any number")

    def _reduce_over_ranks(self, sums: list[float], maxima: list[float]) -> tuple[list[float], list[float]]:
        """Sums and maxima over all ranks (merge_metrics's partial values), in two collectives."""
        if self.world_size == 1:
            return sums, maxima
        totals = torch.tensor(sums, dtype=torch.float64, device=self.device)
        largest = torch.tensor(maxima, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(totals)
        torch.distributed.all_reduce(largest, op=torch.distributed.ReduceOp.MAX)
        return totals.tolist(), largest.tolist()

    @torch.no_grad()
    def weights_finite(self) -> bool:
        """Whether every weight is a finite number, on every rank (each checks what it holds: under ZeRO-3 its
        shards), in one collective."""
        mine = all(bool(torch.isfinite(getattr(p, "ds_tensor", p)).all()) for p in self.module.parameters())
        return self._sum_over_ranks(float(not mine))[0] == 0

    def _sum_over_ranks(self, *values: float) -> list[float]:
        """Sum per-rank numbers over all ranks, in one collective."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world_size > 1:
            torch.distributed.all_reduce(tensor)
        return tensor.tolist()


def _copy_side_files(source: Path, target: Path) -> None:
    """Tokenizer, chat template and generation config travel with the weights (the model files do not)."""
    skip = {"config.json", "model.safetensors.index.json"}
    for path in source.iterdir():
        if (path.is_file() and path.suffix in (".json", ".jinja", ".txt", ".model", ".tiktoken")
                and path.name not in skip and not path.name.startswith("hubgym_")):  # not our markers
            shutil.copy2(path, target / path.name)


def _gather(params: list[torch.Tensor]):
    """ZeRO-3 parameters made whole for the duration (a no-op for whole ones)."""
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, enabled=any(hasattr(p, "ds_id") for p in params))


def _barrier() -> None:
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()


def shutdown() -> None:
    """Tear down the process group (a rare abort at interpreter exit happens without it)."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def state_summary(policy: Policy) -> dict[str, Any]:
    return {"zero_stage": policy.settings.zero_stage, "dtype": str(policy.dtype), "world_size": policy.world_size}
