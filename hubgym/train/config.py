"""The training config: one YAML file, every option documented, `--set key=value` overrides.

    cfg = load_config("train.yaml", ["online.steps=10", "loss.variant=dapo"])
    cfg = load_config("tiny")   # a shipped config by name (hubgym/train/configs/tiny.yaml): `shipped_configs()`

Each option's description lives next to it (`Field(description=...)`): `hubgym train --options`
prints them all as a table, so the docs cannot drift from the code. Unknown keys are refused
with the closest known name, because a typo that silently falls back to a default wastes a run.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterator, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hubgym.engines.settings import DTYPES, EngineSettings
from hubgym.errors import HubgymError
from hubgym.files import read_config_text
from hubgym.mixture.spec import MixEntry
from hubgym.score.select import Selection


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)  # no NaN or inf setting


class EnvMix(MixEntry, Section):
    """One `envs` entry: a name ENV[:CONFIG], or a selector {source: FAMILY} / {tag: TAG} that expands through
    the catalog, with a weight (see hubgym.mixture.spec for how weights combine) and optional seed/size."""


class Offline(Section):
    sources: list[str] = Field(default_factory=list, description="rollout run folders, shard files or Hub refs "
                               "(org/name[@rev][:RUN]) to train on first")
    steps: int = Field(0, ge=0, description="optimizer steps on stored rollouts (phase 1)")
    loss: Literal["grpo", "sft"] = Field("grpo", description="objective for stored rows: grpo (group advantages, "
                                         "importance-corrected against the stored behaviour logprobs) or sft (the "
                                         "likelihood of the completions' sampled tokens; with a reward selection, "
                                         "rejection-sampling fine-tuning; needs no logprobs)")
    select: Selection = Field(default_factory=Selection, description="which stored rows train (see "
                              "hubgym.score.select); reported before the first step")
    rescore: bool = Field(False, description="score stored rows with the env's current verifier (or "
                          "offline.verifier / offline.env_revision) as they are read, before advantages")
    verifier: list[str] = Field(default_factory=list, description="with rescore: MODULE or ENV=MODULE, as `hubgym "
                                "score --verifier` takes them")
    env_revision: list[str] = Field(default_factory=list, description="with rescore: hub env revisions "
                                    "(org/name@rev) whose verifiers score their env's rows (pinned with --pin, or "
                                    "--trust)")

    @field_validator("sources")
    @classmethod
    def _each_source_once(cls, sources: list[str]) -> list[str]:
        """A source listed twice would train its groups twice as often as the others."""
        return listed_once(sources)

    @model_validator(mode="after")
    def _verifier_needs_rescore(self) -> "Offline":
        """A verifier named for stored rows that are never re-scored would be silently ignored."""
        if (self.verifier or self.env_revision) and not self.rescore:
            named = "offline.verifier" if self.verifier else "offline.env_revision"
            raise ValueError(f"{named} names the verifier that re-scores stored rows, but offline.rescore is false; "
                             f"set offline.rescore=true, or remove {named}")
        return self

    @property
    def selects(self) -> bool:
        """Whether the stored rows are planned first (a rule is on, or they are re-scored)."""
        return self.rescore or self.select != Selection()


class Online(Section):
    steps: int = Field(0, ge=0, description="optimizer steps on fresh rollouts of the policy (phase 2)")
    sync_every: int = Field(1, ge=1, description="sync trained weights into vLLM every K steps")
    offline_fraction: float = Field(0.0, ge=0, le=1, description="share of each online step's groups drawn from the "
                                    "offline sources (the mix schedule; 0 = only fresh rollouts)")
    async_steps: int = Field(0, ge=0, description="sample the rollouts of step t while steps t-k..t-1 train (k "
                             "steps off-policy, corrected by the IS weight); 0 = strictly on-policy")
    split: str = Field("train", description="split the online tasks come from")
    push: str | None = Field(None, description="also push the online rollouts (OUT/online) to this rollout repo, "
                             "as config 'online', at every checkpoint and at the end")
    max_model_len: int = Field(4096, ge=16, description="vLLM context length (prompt + every turn); at most the "
                               "model's max_position_embeddings")
    difficulty_stats: list[str] = Field(default_factory=list, description="task stats to start the difficulty "
                                        "band from: stats or rollout run folders, or hub repos (hubgym stats)")
    pass_band: tuple[float, float] = Field((0.0, 1.0), description="(low, high): draw only tasks whose pass rate is "
                                           "between low and high (tasks with too few samples are drawn); "
                                           "(0, 1) with no difficulty_stats = no band")
    difficulty_min_samples: int = Field(8, ge=1, description="samples a task needs before the band judges its pass "
                                        "rate")

    @field_validator("pass_band")
    @classmethod
    def _band_in_unit_interval(cls, band: tuple[float, float]) -> tuple[float, float]:
        """A pass rate lies in [0, 1]; an empty band would reject every task and stop the run at its first draw."""
        low, high = band
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"pass_band=({low:g}, {high:g}) must satisfy 0 <= low <= high <= 1 (pass rates); "
                             f"e.g. (0.1, 0.9) keeps tasks the policy sometimes but not always solves")
        return band

    @field_validator("difficulty_stats")
    @classmethod
    def _each_stats_source_once(cls, sources: list[str]) -> list[str]:
        return listed_once(sources)


class Sampling(Section):
    temperature: float = Field(1.0, ge=0, description="sampling temperature of online rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling of online rollouts")
    max_tokens: int = Field(1024, ge=1, description="tokens per turn")
    tool_parser: str = Field("hermes", description="how tool calls are read from replies: 'hermes' (<tool_call> "
                             "JSON) or any vLLM --tool-call-parser name")
    reasoning_parser: str | None = Field(None, description="a vLLM --reasoning-parser name (e.g. qwen3): <think> "
                                         "text goes to the reply's `reasoning`; rewards see only the answer")
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="JSON object passed to every "
                                                 "chat template render, e.g. {enable_thinking: false}")

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _template_kwargs(cls, value: Any) -> Any:
        """Not a JSON object of template variables: one line naming the fix (pydantic's own is a type dump)."""
        from hubgym.rollout.tokens import check_chat_template_kwargs

        try:
            return check_chat_template_kwargs(value, "sampling.chat_template_kwargs")
        except HubgymError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _known_parsers(self) -> "Sampling":
        """A parser name vLLM does not know: one line listing the known names (vLLM is imported only then)."""
        if self.tool_parser == "hermes" and self.reasoning_parser is None:
            return self
        from hubgym.rollout.parsing import check_parser_names

        try:
            check_parser_names(self.tool_parser, self.reasoning_parser, tool_setting="sampling.tool_parser",
                               reasoning_setting="sampling.reasoning_parser")
        except HubgymError as exc:
            raise ValueError(str(exc)) from None
        return self


class Grpo(Section):
    n: int = Field(8, ge=2, le=65_536, description="samples per task (group size; at most 65,536, as `rollout --n`)")
    advantage: Literal["grpo", "dr_grpo"] = Field("grpo", description="grpo: (r-mean)/std; dr_grpo: r-mean "
                                                  "(loss.variant dr_grpo implies dr_grpo)")
    zero_variance: Literal["drop", "downweight", "keep"] = Field("drop",
                                                                 description="groups whose rewards are all equal")
    zero_variance_weight: float = Field(0.1, ge=0, description="with 'downweight', how much a zero-variance "
                                        "sequence counts in the loss's divisors (keep = 1, drop = 0)")
    short_groups: Literal["drop", "keep", "error"] = Field("drop", description="groups with fewer than n rows")
    truncated: Literal["keep", "mask", "zero"] = Field("keep", description="truncated completions: train as is, "
                                                       "mask their tokens, or zero their advantage")
    strict: bool = Field(False, description="a bad row (token record, unknown env) is an error instead of a warning")


class Loss(Section):
    variant: Literal["grpo", "dr_grpo", "dapo"] = Field("grpo", description="aggregation: per-sequence mean (grpo), "
                                                         "sum / (sequences x max_tokens) with advantages not divided "
                                                         "by the group std (dr_grpo), token mean (dapo)")
    epsilon_low: float = Field(0.2, ge=0, lt=1, description="lower clip of the policy ratio, at 1 - epsilon_low")
    epsilon_high: float = Field(0.28, ge=0, description="upper clip of the policy ratio (clip-higher)")
    beta: float = Field(0.0, ge=0, description="KL to the reference (initial) model; 0 = no reference model")
    is_cap: float = Field(2.0, ge=1, description="cap of the importance weight vs behaviour logprobs; below 1 "
                          "it would cap the on-policy tokens too")
    max_staleness: int | None = Field(None, ge=0, description="mask online rows sampled more than this many "
                                      "policy versions ago (stored rows are never masked)")
    output_layer: Literal["fused", "chunked", "liger"] = Field(
        "fused", description="how the loss applies the output layer, never holding the (tokens x vocabulary) "
        "logits: fused (chunks whose gradients are made in the forward), chunked (chunks recomputed in backward) "
        "or liger (Liger-Kernel's fused linear cross-entropy: pip install 'hubgym[gpu]')")

    @field_validator("output_layer")
    @classmethod
    def _liger_installed(cls, value: str) -> str:
        """Known when the config loads, not at the first step."""
        import importlib.util

        if value == "liger" and importlib.util.find_spec("liger_kernel") is None:
            raise ValueError("loss.output_layer=liger needs Liger-Kernel: pip install 'hubgym[gpu]' (or "
                             "liger-kernel), or use the default loss.output_layer=fused")
        return value


class Batch(Section):
    groups_per_step: int = Field(8, ge=1, description="GRPO groups per optimizer step (global batch); "
                                 "online: tasks sampled per step")
    micro_batch_tokens: int = Field(8192, ge=64, description="token budget of one micro-batch (padding included)")
    buffer_groups: int = Field(256, ge=1, description="incomplete groups held while streaming (memory bound)")


class Optim(Section):
    lr: float = Field(1e-6, gt=0, le=1, description="AdamW learning rate (peak); above 1 an AdamW update moves "
                      "each weight by more than 1 (and past ~1e37 it overflows float32 inside torch)")
    schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="learning-rate schedule "
                                                               "after warmup: constant, or linear / cosine decay "
                                                               "to min_lr_ratio x lr at the run's last step")
    warmup_steps: int = Field(0, ge=0, description="linear warmup from lr/warmup_steps to lr over this many "
                              "optimizer updates")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="where linear / cosine decay ends, as a fraction "
                                "of lr")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    zero_stage: Literal[2, 3] = Field(2, description="DeepSpeed ZeRO stage")
    bf16: Literal["auto", "true", "false"] = Field("auto", description="bf16 weights and activations with fp32 "
                                                   "master weights and AdamW state in DeepSpeed's ZeRO optimizer; "
                                                   "'auto': on GPUs that support bf16, fp32 on CPUs (true also "
                                                   "trains on a CPU, slower there than fp32)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward")
    compile: bool = Field(False, description="run the model's decoder under torch.compile (dynamic shapes): "
                          "fewer, fused kernels where a GPU's step is bound by launching them. Off by default: "
                          "the first steps pay the compilation (about a minute on 2 CPU cores, more than a short "
                          "run saves: bench/RESULTS.md)")

    @field_validator("bf16", mode="before")
    @classmethod
    def _yaml_boolean(cls, value: Any) -> Any:
        """YAML reads `bf16: false` (and `--set optim.bf16=false`) as a boolean."""
        return str(value).lower() if isinstance(value, bool) else value


class Lora(Section):
    r: int = Field(0, ge=0, description="LoRA rank (peft); 0 = full fine-tuning. Only the adapters train; vLLM, "
                   "the export and evaluation get the merged weights")
    alpha: float = Field(32.0, gt=0, description="LoRA scale numerator: the update is alpha / r x B @ A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input (0 keeps the trained "
                           "policy's logprobs deterministic, as the importance ratios assume)")
    target_modules: list[str] = Field(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                       "down_proj"], description="linear modules that get adapters: "
                                      "names such as q_proj, or dotted suffixes such as self_attn.q_proj")


class Eval(Section):
    every: int = Field(0, ge=0, description="evaluate every K steps (0 = only before and after training)")
    after_offline: bool = Field(False, description="also evaluate when the offline phase ends, before the first "
                                "online step: what the stored rollouts alone taught")
    split: str = Field("test", description="held-out split")
    limit: int = Field(32, ge=0, description="tasks per env (0 = no evaluation)")
    n: int = Field(4, ge=1, le=65_536, description="samples per task (pass@k uses them; at most 65,536)")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of evaluation rollouts")


class Log(Section):
    every: int = Field(1, ge=1, description="console table every K steps")
    trackio: bool = Field(False, description="also log to trackio (pip install trackio)")
    tensorboard: bool = Field(False, description="also log to TensorBoard (OUT/tensorboard)")
    wandb: bool = Field(False, description="also log to Weights & Biases (pip install wandb)")


class Vllm(Section):
    """Where online rollouts are sampled and how vLLM runs. `local`: vLLM's offline engine in the trainer's
    process, on the trainer's GPU (colocated); `server`: a separate vLLM server (other GPUs or machines) that
    the trainer samples from and pushes its weights to."""

    engine: Literal["local", "server"] = Field("local", description="local: vLLM in the trainer's process; server: "
                                               "a vLLM server at vllm.base_url (started with VLLM_SERVER_DEV_MODE=1)")
    base_url: str | None = Field(None, description="the server's OpenAI base URL, e.g. http://10.0.0.2:8000/v1 "
                                 "(vllm.engine server)")
    served_model: str | None = Field(None, description="server: the name it serves the trainer's model under "
                                     "(default: the model folder's path, as --model DIR names it)")
    weight_transfer: Literal["file", "nccl"] = Field("file", description="server: how weights reach it. file: a "
                                                     "safetensors file in vllm.sync_dir that the server reloads; "
                                                     "nccl: vLLM's NCCL weight transfer, GPU to GPU (server started "
                                                     "with --weight-transfer-config '{\"backend\": \"nccl\"}')")
    sync_dir: str | None = Field(None, description="server, file transfer: a folder the trainer writes and the "
                                 "server reads at the same path, e.g. on a shared disk (default: OUT/sync)")
    nccl_address: str | None = Field(None, description="server, nccl transfer: this trainer's address as the "
                                     "server's workers reach it (default: the address that routes to the server)")
    dtype: Literal[DTYPES] = Field("auto", description="local: weights and "
                                                                     "activations in vLLM; auto: vLLM's choice on a "
                                                                     "GPU (bfloat16 for an fp32 checkpoint), "
                                                                     "float32 on a CPU")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="local: share of the GPU's memory vLLM "
                                          "takes (weights + KV cache); the rest is the trainer's")
    tensor_parallel_size: int = Field(1, ge=1, description="local: GPUs one vLLM engine spans")
    enable_sleep_mode: bool = Field(False, description="local, GPU only: vLLM sleeps (weights to CPU memory, KV "
                                    "cache freed) while the trainer steps, and wakes for rollouts")
    enforce_eager: bool = Field(False, description="local: skip torch.compile (starts sooner, decodes slower; for "
                                "short runs on a CPU)")

    def engine_settings(self) -> EngineSettings:
        """The local engine's settings, as every engine takes them."""
        return EngineSettings(dtype=self.dtype, gpu_memory_utilization=self.gpu_memory_utilization,
                              tensor_parallel_size=self.tensor_parallel_size, enable_sleep_mode=self.enable_sleep_mode,
                              enforce_eager=self.enforce_eager)

    @model_validator(mode="after")
    def _server_needs_url(self) -> Vllm:
        """A server run needs the URL; local-engine settings would be silently ignored by a server."""
        if self.engine == "server":
            if not self.base_url:
                raise ValueError("vllm.engine=server needs vllm.base_url, the server's OpenAI base URL "
                                 "(e.g. --set vllm.base_url=http://127.0.0.1:8000/v1)")
            local = sorted(self.model_fields_set & {"dtype", "gpu_memory_utilization", "tensor_parallel_size",
                                                    "enable_sleep_mode"})
            if local:
                raise ValueError(f"vllm.{local[0]} sets the trainer's own vLLM engine, but vllm.engine=server "
                                 f"samples from a server; give it on the server's command line (--"
                                 f"{local[0].replace('_', '-')}) and remove vllm.{local[0]}")
        return self


class TrainConfig(Section):
    """Every option of a training run, as YAML keys (`hubgym train --options` lists them with their defaults).
    The defaults are for a pretrained model on a GPU; the tiny model's values live in the shipped `tiny` config.
    Validated as a whole on load, so an option that contradicts another is one line naming both."""

    model: str = Field("tiny", description="model folder; 'tiny' makes the tiny local model")
    output_dir: str = Field("runs/train", description="checkpoints, shards, metrics, plots")
    envs: list[EnvMix] = Field(default_factory=lambda: [EnvMix(name="arithmetic:tiny")],
                               description="envs for online rollouts and evaluation, with mixture weights: "
                               "{name: ENV[:CONFIG]}, or {source: FAMILY} / {tag: TAG} selecting many (weights "
                               "add up per env config; see hubgym.mixture.spec)")
    seed: int = Field(0, description="seeds sampling, task draws, DeepSpeed and the stream")
    checkpoint_every: int = Field(0, ge=0, description="save every K steps (0 = only at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept (oldest deleted)")
    dist_timeout_s: float = Field(1800.0, gt=0, description="several processes or nodes: how long a rank waits "
                                  "for the others (the launcher's rendezvous, every collective) before the run "
                                  "stops with an error; above the longest vLLM sampling or evaluation of rank 0")
    offline: Offline = Field(default_factory=Offline)
    online: Online = Field(default_factory=Online)
    sampling: Sampling = Field(default_factory=Sampling)
    grpo: Grpo = Field(default_factory=Grpo)
    loss: Loss = Field(default_factory=Loss)
    batch: Batch = Field(default_factory=Batch)
    optim: Optim = Field(default_factory=Optim)
    lora: Lora = Field(default_factory=Lora)
    eval: Eval = Field(default_factory=Eval)
    log: Log = Field(default_factory=Log)
    vllm: Vllm = Field(default_factory=Vllm)

    @property
    def total_steps(self) -> int:
        return self.offline.steps + self.online.steps

    @model_validator(mode="after")
    def _staleness_admits_the_schedule(self) -> TrainConfig:
        """Rollouts sampled k steps ahead by weights synced every S steps are up to k + S - 1 versions old by
        design: a tighter bound would mask whole steps of them."""
        bound, o = self.loss.max_staleness, self.online
        lag = o.async_steps + o.sync_every - 1
        if bound is not None and o.steps and lag > bound:
            raise ValueError(f"loss.max_staleness={bound} is below the lag the schedule gives online rows "
                             f"(online.async_steps + online.sync_every - 1 = {lag}), so whole steps would train on "
                             f"nothing; set loss.max_staleness >= {lag}, or lower async_steps or sync_every")
        return self

    @model_validator(mode="after")
    def _dr_grpo_has_no_std(self) -> TrainConfig:
        """Dr. GRPO removes both the length normalization and the std scaling: loss.variant dr_grpo implies
        grpo.advantage dr_grpo, and an explicit mix of the two is refused."""
        if self.loss.variant != "dr_grpo":
            return self
        if "advantage" in self.grpo.model_fields_set and self.grpo.advantage != "dr_grpo":
            raise ValueError(f"loss.variant=dr_grpo leaves the group std out of the advantages (Dr. GRPO), but "
                             f"grpo.advantage={self.grpo.advantage} divides by it; leave grpo.advantage unset (the "
                             f"variant implies dr_grpo), or choose loss.variant grpo or dapo to keep the std")
        self.grpo.advantage = "dr_grpo"
        return self

    @model_validator(mode="after")
    def _online_rows_fit_a_micro_batch(self) -> TrainConfig:
        """An online rollout (prompt, every turn and tool output) is up to online.max_model_len tokens, and a
        sequence is never split across micro-batches: a smaller budget would stop the run at the first long one."""
        budget, length = self.batch.micro_batch_tokens, self.online.max_model_len
        if self.online.steps and length is not None and budget < length:
            raise ValueError(f"batch.micro_batch_tokens={budget} is below online.max_model_len={length}, the length "
                             f"an online rollout can reach, and a sequence must fit one micro-batch; set "
                             f"batch.micro_batch_tokens to {length} or more, or lower online.max_model_len")
        return self

    @model_validator(mode="after")
    def _offline_needs_sources(self) -> TrainConfig:
        """Stored-rollout steps or a stored share of online steps with nothing to read would train on nothing."""
        if not self.offline.sources and (self.offline.steps or self.online.offline_fraction):
            raise ValueError(f"offline.steps={self.offline.steps} and online.offline_fraction="
                             f"{self.online.offline_fraction} need stored rollouts, but offline.sources is empty; "
                             f"list run folders or hub refs under offline.sources, or set both to 0")
        return self


class ConfigError(HubgymError, ValueError):
    """A config file or override that cannot be used; the message says which key and how to fix it."""


SHIPPED = Path(__file__).with_name("configs")
TINY_CONFIG = SHIPPED / "tiny.yaml"  # the tiny local model's values; the built-in defaults are a real model's


def shipped_configs() -> dict[str, Path]:
    """The configs that come with hubgym, by name (`hubgym train NAME` finds them when no such file exists)."""
    return {p.stem: p for p in sorted(SHIPPED.glob("*.yaml"))}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read YAML (or start from the defaults), apply `key.sub=value` overrides, validate. `path` may also name a
    shipped config ('tiny', ...) when no file of that name exists."""
    data: dict[str, Any] = {}
    if path is not None and not Path(path).exists() and str(path) in shipped_configs():
        path = shipped_configs()[str(path)]
    if path is not None:
        try:  # a small regular file of UTF-8 text: a FIFO, /dev/zero or a dataset given by mistake is one line
            data = yaml.safe_load(read_config_text(path)) or {}
        except (ValueError, yaml.YAMLError, RecursionError) as exc:
            problem = "nested too deep" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:300]
            raise ConfigError(f"cannot read training config {path}: {problem}; give a YAML file of settings (see "
                              f"`hubgym train --options`)") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of options, got {type(data).__name__}")
    for item in overrides or []:
        _apply_override(data, item)
    _check_keys(data, TrainConfig, "")
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid training config{f' {path}' if path else ''}: {_problems(exc)}") from None


def validate_options(section: str, **values: Any) -> None:
    """Check option values against the config's rules, the one place they live; for settings built without a
    config file (LossSettings...). `section` names the config section: validate_options("loss", is_cap=0.5)."""
    model = TrainConfig.model_fields[section].annotation
    try:
        model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(_problems(exc, prefix=f"{section}.")) from None


BOUNDS = {"greater_than_equal": ("ge", ">=", "{} or more"), "greater_than": ("gt", ">", "a value above {}"),
          "less_than_equal": ("le", "<=", "{} or less"), "less_than": ("lt", "<", "a value below {}")}


def _problems(exc: ValidationError, prefix: str = "") -> str:
    """One clause per problem; a value out of range gets the value, the invariant and the fix."""
    problems = []
    for e in exc.errors():
        key = prefix + ".".join(map(str, e["loc"]))
        if e["type"] in BOUNDS:
            name, op, fix = BOUNDS[e["type"]]
            limit = f"{e['ctx'][name]:g}"
            field = _field(key)
            why = f" ({field.description})" if field is not None and field.description else ""
            problems.append(f"{key}={e['input']!r} must be {op} {limit}; set it to {fix.format(limit)}{why}")
        elif e["type"] == "finite_number":  # NaN or inf: a learning rate of inf trains NaN weights
            problems.append(f"{key}={e['input']!r} must be a finite number; give a number like 0.5 or 1e-6")
        else:
            problems.append(f"{key + ': ' if key else ''}{e['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)


def _field(key: str):
    """The pydantic field of a dotted option name, or None (list items, unknown keys)."""
    model: Any = TrainConfig
    *parents, leaf = key.split(".")
    for part in parents:
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        model = field.annotation
    return model.model_fields.get(leaf) if isinstance(model, type) and issubclass(model, BaseModel) else None


def _apply_override(data: dict, item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: write key=value, e.g. --set online.steps=10")
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item!r}: {part!r} is not a section")
    node[leaf] = yaml.safe_load(raw)  # YAML scalars: 3, 0.5, true, [a, b], {name: x}


def _check_keys(data: dict, model: type[BaseModel], prefix: str) -> None:
    """Refuse unknown keys with the closest valid name (pydantic's message does not suggest one)."""
    for key, value in data.items():
        if key not in model.model_fields:
            close = difflib.get_close_matches(key, list(model.model_fields), n=1)
            hint = f"; did you mean {prefix + close[0]!r}?" if close else f"; valid: {', '.join(model.model_fields)}"
            raise ConfigError(f"unknown training option {prefix + key!r}{hint} (`hubgym train --options` lists all)")
        annotation = model.model_fields[key].annotation
        if isinstance(value, dict) and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            _check_keys(value, annotation, f"{prefix}{key}.")


def describe_options(model: type[BaseModel] = TrainConfig, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(key, default, description) for every option, nested sections flattened: the option reference."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):  # a section, or offline.select
            yield from describe_options(annotation, f"{prefix}{name}.")
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list):
            default = [d.model_dump(exclude_none=True) if isinstance(d, BaseModel) else d for d in default]
        yield f"{prefix}{name}", repr(default), field.description or ""


def listed_once(sources: list[str]) -> list[str]:
    """`sources` unchanged, or a ValueError naming each one listed more than once."""
    twice = sorted({s for s in sources if sources.count(s) > 1})
    if twice:
        raise ValueError(f"lists {', '.join(twice)} more than once; list each source once")
    return sources
