"""Record a TRL GRPOTrainer run as a hubgym run: every generation batch becomes rows of rollout shards.

    env = trl_env("wordle")
    trainer = GRPOTrainer(MODEL, args=args, processing_class=tokenizer, **env.trainer_kwargs())
    env.record(trainer, "runs/trl-wordle")        # the one line; the run is complete when trainer.train() ends
    trainer.train()

Then `hubgym report`, `score`, `replay`, `view`, `push-rollouts` and `train` read `runs/trl-wordle` as any run
(what a row holds: hubgym.integrations.trl_rows).

How it sees the tokens. GRPOTrainer 1.16 has no callback that gets them: `_generate` is the one method that returns
prompt ids, completion ids, the tool mask and sampling logprobs together, and `_generate_and_score_completions`
the one that holds the dataset rows and, when it returns, the rewards. The recorder wraps both on the trainer it
is given (instance attributes; the class is untouched) and passes everything through unchanged: training is what
it would be without it. TRL's transformers generation keeps no logprobs, so `_generate_single_turn` is wrapped too,
with a forward hook that reads them as the model computes them (hubgym.integrations.trl_logprobs); with vLLM, TRL's
own are stored. The step builds its batch's rows (a few milliseconds: it holds the verifier) and hands them to a
writer process at the lowest CPU priority, which audits the tokens, encodes and writes them
(hubgym.integrations.trl_writer), so the step waits neither for the disk nor for a thread holding the GIL;
`close()` (called when training ends, and at exit) waits until everything queued is written with the manifest.

The run folder is a hubgym run: one worker per TRL process (`w<rank>of<world>`), its lock held by its writer, the
run id a hash of the model, env and the TRL settings that shape what is sampled, so a second run with other
settings is refused rather than mixed in. Rows already stored (a re-run) are not written twice. Eval batches are
not recorded.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from hubgym.errors import IntegrationError
from hubgym.integrations.trl_messages import INSTALL, TASK_COLUMN
from hubgym.integrations.trl_logprobs import GenerateCall, LogprobTap, splice
from hubgym.integrations.trl_rows import GenerationBatch, RunContext, batch_rows, manifest_fields
from hubgym.integrations.trl_writer import RowSink, WriterProcess, WriterSetup

WRAPPED = ("_generate_and_score_completions", "_generate", "_generate_single_turn")
RUN_SETTINGS = ("seed", "learning_rate", "num_generations", "per_device_train_batch_size",
                "gradient_accumulation_steps", "steps_per_generation", "num_iterations", "max_steps",
                "num_train_epochs", "max_completion_length", "temperature", "top_p", "top_k", "min_p",
                "repetition_penalty", "generation_kwargs", "beta", "loss_type", "epsilon", "epsilon_high",
                "max_tool_calling_iterations", "use_vllm", "reward_weights", "chat_template_kwargs")
"""GRPOConfig fields that change what a run samples or learns: the run id hashes them (output paths, logging and
saving do not)."""


def _trainer_callback_base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as exc:  # pragma: no cover - transformers comes with TRL
        raise ImportError(f"TRL is not installed: {INSTALL}") from exc
    return TrainerCallback


class TRLRecorder(_trainer_callback_base()):  # type: ignore[misc]
    """Stores every generation batch of one GRPOTrainer as hubgym rollout rows (see the module docstring)."""

    @classmethod
    def attach(cls, trainer: Any, env: Any, out: str | Path, *, run_id: str | None = None,
               background: bool = True) -> TRLRecorder:
        """Wrap `trainer`'s generation and start recording into `out` (`env`: the TRLEnv it trains on).
        `background=False` audits and writes each batch on the step's own path (for debugging a recording)."""
        missing = [name for name in WRAPPED if not callable(getattr(trainer, name, None))]
        if missing or not hasattr(trainer, "state"):
            import trl

            raise IntegrationError(
                f"this trainer ({type(trainer).__name__}, TRL {trl.__version__}) has no {', '.join(missing)}, which "
                f"the recorder wraps to see the tokens it generates; record a trl.GRPOTrainer of TRL 1.16",
                framework="trl", setting="trainer")
        recorder = cls(trainer, env, Path(out), run_id or run_id_of(trainer, env), background)
        trainer.add_callback(recorder)
        return recorder

    def __init__(self, trainer: Any, env: Any, out: Path, run_id: str, background: bool):
        from hubgym.rollout.writer import worker_name

        super().__init__()
        self.trainer, self.env, self.out, self.run_id = trainer, env, out, run_id
        accelerator = trainer.accelerator
        self.context = run_context(trainer, env, run_id)
        setup = WriterSetup(out, worker_name(accelerator.process_index, accelerator.num_processes), run_id,
                            self.context.renderer, self.context.tool_schemas, manifest_fields(self.context))
        self.sink: RowSink | WriterProcess = WriterProcess(setup) if background else RowSink(setup)
        self.rows_written: int | None = 0  # rows in the run folder's part of this worker, counted when it closes
        self.batches, self.error = 0, None
        self.write_s = 0.0  # CPU seconds the writer spent auditing and writing rows (off the step's path in background)
        self.path_s = 0.0  # seconds the recorder adds to the step's own path: the logprob hook, building the rows
        self._at_step: tuple[int, int] = (-1, 0)  # (global step, batches generated at it so far)
        self._calls: list[GenerateCall] = []
        self._generation: dict[str, Any] | None = None
        self._tapping = False
        self._originals = {name: getattr(trainer, name) for name in WRAPPED}
        trainer._generate_and_score_completions = self._generate_and_score
        trainer._generate = self._generate
        trainer._generate_single_turn = self._single_turn
        self._closed = False
        atexit.register(self.close)

    def __repr__(self) -> str:
        return f"TRLRecorder(run_id={self.run_id!r}, out={str(self.out)!r}, rows={self.rows_written})"

    # -- what TRL calls ----------------------------------------------------------------------------------------

    def _generate_and_score(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        original = self._originals["_generate_and_score_completions"]
        if not self.trainer.model.training or self._closed:  # eval batches are not recorded
            return original(inputs)
        self._calls, self._generation, self._tapping = [], None, True
        started = time.perf_counter()
        try:
            output = original(inputs)
        finally:
            self._tapping = False
        if self._generation is not None:
            handed = time.perf_counter()
            self._hand_over(inputs, handed - started)
            self.path_s += time.perf_counter() - handed
        return output

    def _generate(self, prompts: list) -> tuple:
        result = self._originals["_generate"](prompts)
        if self._tapping:
            prompt_ids, completion_ids, tool_mask, completions, logprobs = result[:5]
            self._generation = {"prompts": prompts, "prompt_ids": prompt_ids, "completion_ids": completion_ids,
                                "tool_mask": tool_mask, "completions": completions, "logprobs": logprobs}
        return result

    def _single_turn(self, *args: Any, **kwargs: Any) -> tuple:
        original = self._originals["_generate_single_turn"]
        trainer = self.trainer
        if not self._tapping or trainer.use_vllm or getattr(trainer, "use_transformers_continuous_batching", False):
            return original(*args, **kwargs)
        model = trainer.accelerator.unwrap_model(trainer.model)
        with LogprobTap(model) as tap:
            completion_ids, logprobs = original(*args, **kwargs)
        started = time.perf_counter()
        prompt_ids = args[0] if args else kwargs["prompt_ids"]
        self._calls.append(GenerateCall([list(p) for p in prompt_ids], [list(c) for c in completion_ids],
                                        tap.logprobs(completion_ids)))
        self.path_s += tap.seconds + time.perf_counter() - started
        return completion_ids, logprobs

    def _hand_over(self, inputs: list[dict[str, Any]], seconds: float) -> None:
        """Build this batch's rows from what it made and hand them to the writer."""
        gen, trainer = self._generation, self.trainer
        environments = list(trainer.environments) if getattr(trainer, "environments", None) else [None] * len(inputs)
        tasks = [x[TASK_COLUMN] for x in inputs]
        scores = self.env.scorer.scores(gen["completions"], tasks, environments)  # TRL's batch: scored once already
        step = trainer.state.global_step
        index = self._at_step[1] if self._at_step[0] == step else 0
        self._at_step = (step, index + 1)
        batch = GenerationBatch(
            step=step, index=index, inputs=[dict(x) for x in inputs], prompts=gen["prompts"],
            prompt_ids=gen["prompt_ids"], completion_ids=gen["completion_ids"], tool_mask=gen["tool_mask"],
            completions=gen["completions"], logprobs=self._logprobs(gen), scores=scores, seconds=seconds)
        self.batches += 1
        self.sink.put(batch_rows(batch, self.context), step)  # background=False: audited and written right here

    def _logprobs(self, gen: dict[str, Any]) -> list[list[float] | None]:
        """TRL's own (vLLM), else the tapped ones laid on the final completions."""
        rows = len(gen["completion_ids"])
        if gen["logprobs"] is not None:  # vLLM's; a token it could not score (None) leaves the row without any
            return [None if any(x is None for x in lp) else [float(x) for x in lp] for lp in gen["logprobs"]]
        if not self._calls:
            return [None] * rows
        masks = gen["tool_mask"] or [[1] * len(ids) for ids in gen["completion_ids"]]
        return [splice(self._calls, i, list(gen["prompt_ids"][i]), list(gen["completion_ids"][i]), list(masks[i]))
                for i in range(rows)]

    # -- the end -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Unwrap the trainer, wait until the writer has written everything queued and the manifest, and give the
        run folder back (idempotent). A write that failed is raised here."""
        if self._closed:
            return
        self._closed = True
        for name, method in self._originals.items():
            setattr(self.trainer, name, method)
        atexit.unregister(self.close)
        stats = self.sink.close()
        self.rows_written, self.write_s, self.error = stats["rows"], stats["write_s"], stats.get("error")
        if self.error is not None:
            raise IntegrationError(f"recording into {self.out} failed: {self.error}; the rows stored before it are "
                                   f"kept", framework="trl", setting="out")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()


# -- what every row shares -------------------------------------------------------------------------------------------


def run_context(trainer: Any, env: Any, run_id: str) -> RunContext:
    """The run's shared row fields: model, sampling settings, engine versions, stop ids, tool schemas, renderer."""
    import transformers
    import trl

    import hubgym
    from hubgym.rollout.tokens import ChatRenderer

    args = trainer.args
    schemas = tool_schemas(trainer)
    kwargs = dict(getattr(trainer, "chat_template_kwargs", None) or {})
    sampling: dict[str, Any] = {
        "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty, "max_tokens": args.max_completion_length,
        "n": args.num_generations, "seed": args.seed, "generation_kwargs": args.generation_kwargs or {},
        "max_tool_calling_iterations": args.max_tool_calling_iterations}
    if schemas:
        sampling["tools"] = schemas
    if kwargs:
        sampling["chat_template_kwargs"] = kwargs
    backend = "vLLM" if trainer.use_vllm else "transformers continuous batching" if getattr(
        trainer, "use_transformers_continuous_batching", False) else "transformers generate"
    renderer = None
    if getattr(trainer, "chat_template", None) in (None, trainer._tokenizer.chat_template):
        renderer = ChatRenderer(copy.deepcopy(trainer._tokenizer), chat_template_kwargs=kwargs)  # its own copy,
        # for the writer (a process with background=True, this one's step path without)
    return RunContext(
        run_id=run_id, env=env, model=model_name(trainer), sampling=json.loads(json.dumps(sampling, default=str)),
        engine_version=f"trl {trl.__version__} ({backend}), transformers {transformers.__version__}, "
                       f"hubgym {hubgym.__version__}",
        stop_ids=frozenset(int(t) for t in trainer.eos_token_ids), tool_schemas=schemas, renderer=renderer,
        max_tool_iterations=args.max_tool_calling_iterations or 1)


def tool_schemas(trainer: Any) -> list[dict] | None:
    """The tool schemas TRL renders into every prompt (its env's methods, then its standalone tools), as
    `apply_chat_template` makes them from the functions."""
    from transformers.utils import get_json_schema

    tools = (trainer._env_tools.get(None) if getattr(trainer, "_env_tools", None) else None) or trainer.tools or []
    return [t if isinstance(t, dict) else get_json_schema(t) for t in tools] or None


def model_name(trainer: Any) -> str:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)


def run_id_of(trainer: Any, env: Any) -> str:
    """`trl-<12 hex>`: the same model, env and sampling/learning settings give the same id (a re-run resumes)."""
    args = trainer.args
    settings = {name: getattr(args, name, None) for name in RUN_SETTINGS}
    key = {"model": model_name(trainer), "env": env.env, "config": env.config, "split": env.split,
           "tasks": hashlib.sha256("".join(t["id"] for t in env.tasks).encode()).hexdigest(), "trl": settings}
    return "trl-" + hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
