"""GRPO from the Hub to DeepSpeed: offline on stored rollouts, then online on fresh ones.

    result = Trainer(load_config("train.yaml")).run()

One global step counts optimizer steps. Steps 0..offline.steps-1 read groups from the stored
rollouts (`offline.sources`: run folders, shard files or hub refs), cycling over them; the
remaining `online.steps` sample fresh groups of the current policy with vLLM (weights synced
into the engine every `online.sync_every` steps, `policy_version` = the step of the synced
weights) and, per `online.offline_fraction`, mix in stored groups. Both go through the same
GroupStream -> pack_step -> Policy.train_step path; with `loss.beta > 0` a frozen copy of the initial
weights (hubgym.train.reference) gives each packed micro-batch its reference logprobs for the KL. All
engine work runs on one background thread (hubgym.train.ahead): with `online.async_steps = k` the
rollouts of step t are sampled while steps t-k..t-1 train.

Evaluation runs on each env's held-out split before training, every `eval.every` steps, and
after. A checkpoint (weights, optimizer, stream position, RNG) is written every
`checkpoint_every` steps and at the end; re-running the same config resumes from it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.markup import escape

from hubgym.train.ahead import EngineWorker
from hubgym.train.config import ConfigError, TrainConfig
from hubgym.train.groups import Group, GroupSettings, mask_stale
from hubgym.train.loss import LossSettings, make_loss_fn
from hubgym.train.metrics import MetricsLog
from hubgym.train.packing import pack_step
from hubgym.train.stream import GroupStream


@dataclass
class TrainResult:
    steps: int
    before: dict[str, float]  # eval metrics before training (empty on a resumed run)
    after: dict[str, float]
    after_offline: dict[str, float]  # with eval.after_offline: when the offline phase ended (else empty)
    model_dir: Path  # the exported Hugging Face folder
    metrics_file: Path
    plot: Path | None
    counts: dict[str, int] = field(default_factory=dict)


class Trainer:
    """GRPO on DeepSpeed, one run: offline steps on stored rollouts, then online steps on fresh vLLM rollouts of
    the policy, with weights synced into the engine, checkpoints to resume from, held-out evaluation before and
    after, metrics and plots. `run()` does it all; `close()` frees the engine and DeepSpeed's processes."""

    # After the engine died, how long to wait for a Ctrl-C to show before restarting it: the same Ctrl-C kills
    # vLLM's processes at once, but Python notes it only when the main thread next runs Python code (not during
    # one long native call, such as a backward pass on a GPU).
    STOPPING_GRACE_S = 3.0

    def __init__(self, cfg: TrainConfig, *, console: Console | None = None, engine=None, hub: str | None = None,
                 trust: bool = False, pins: dict[str, str] | None = None):
        self.cfg, self.console, self.hub, self.trust = cfg, console or Console(), hub, trust
        self.pins = dict(pins or {})  # hub repo -> "sha256:<hex>" its verifier must have
        self.out = Path(cfg.output_dir)
        self._engine, self._owns_engine = engine, engine is None  # a given engine is the caller's to close
        self.synced: int | None = None if engine is not None else 0  # a fresh engine serves the initial weights
        self.worker = EngineWorker()  # the engine's jobs: weight syncs, online rollouts
        self.offline_used = 0  # groups taken from the offline stream so far (the stream position)
        self.offline_read: list[dict] = []  # stored rows read since the last step, trainable or not (env metrics)
        self.online_metrics: dict[str, float] = {}  # of the current online step: sync and generation s, staleness
        self.counts: dict[str, int] = {}
        self.skip_reason: str | None = None  # why the last step was skipped (a loss or gradient not finite)
        self.plan = None  # the offline selection (hubgym.score.select.SelectionPlan), when one is configured

    # -- setup ------------------------------------------------------------------------------------

    def model_dir(self) -> str:
        from hubgym.models import resolve_model

        return resolve_model(self.cfg.model, setting="the `model` setting")

    def engine(self):
        """The vLLM engine serving the current weights (started on first use, restarted if it died)."""
        if self._engine is None:
            v = self.cfg.vllm
            if v.engine == "server":  # rollouts from a separate vLLM server; its weights are unknown until pushed
                from hubgym.train.remote_sync import ServerEngine

                self._engine = ServerEngine(self.model_dir(), v.base_url, max_model_len=self.cfg.online.max_model_len,
                                            served_model=v.served_model, transfer=v.weight_transfer,
                                            sync_dir=v.sync_dir, nccl_address=v.nccl_address)
                self.synced = None
            else:
                from hubgym.engines import make_engine

                self._engine = make_engine("vllm", self.model_dir(), max_model_len=self.cfg.online.max_model_len,
                                           seed=self.cfg.seed, settings=v.engine_settings(), separate_core=True)
            self._engine.policy_version = 0
        return self._engine

    def group_settings(self) -> GroupSettings:
        return group_settings(self.cfg)

    def env_weights(self) -> dict[str, float]:
        """Mixture weights by env name (the names rows carry), from the `envs` entries (selectors expanded; two
        configs of one env add up: rows carry the env name only). Nothing is generated."""
        return self._mixture(self.cfg.eval.split).weights_by_env()

    def eval_envs(self) -> list[str]:
        """The env configs evaluated (ENV:CONFIG), one per config the `envs` entries select."""
        return [env.ref if env.config is None else f"{env.ref}:{env.config}"
                for env in self._mixture(self.cfg.eval.split).envs]

    def _mixture(self, split: str):
        from hubgym.mixture import Mixture
        from hubgym.train.online import mixture_spec

        return Mixture.from_spec(mixture_spec(self.cfg.envs), split=split, seed=self.cfg.seed, hub=self.hub,
                                 trust=self.trust, pins=self.pins)

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Train to `total_steps` (resuming from the last checkpoint). A Ctrl-C raises KeyboardInterrupt: the
        step being sampled is dropped, and running the same config again resumes."""
        from hubgym.rollout.interrupt import noting_ctrl_c
        from hubgym.train.nodes import node_failure

        try:
            with noting_ctrl_c(self.worker.stopping):  # a Ctrl-C stops the run even where its exception is swallowed
                return self._run()
        except Exception as exc:  # a node that never joined, a peer that died: one line, not a traceback per rank
            failure = node_failure(exc, timeout_s=self.cfg.dist_timeout_s, output_dir=self.out)
            if failure is None:
                raise
            raise failure from exc

    def _run(self) -> TrainResult:
        from hubgym.train.checkpoint import load_checkpoint
        from hubgym.train.engine import Policy, init_distributed
        from hubgym.train.nodes import check_run_folder_shared

        cfg = self.cfg
        init_distributed(cfg.dist_timeout_s)  # waits for every node, at most dist_timeout_s
        check_run_folder_shared(self.out)  # before a weight is loaded or a checkpoint written
        self.policy = Policy(self.model_dir(), deepspeed_settings(cfg))
        self.reference = None
        if cfg.loss.beta > 0:  # the KL's reference: the initial weights (the model folder, never a checkpoint)
            from hubgym.train.reference import Reference

            self.reference = Reference(self.policy)
        self.weights = self.env_weights()
        client = load_checkpoint(self.policy, self.out / "checkpoints")
        start = client["step"] + 1 if client else 0
        self.offline_used = client["stream"]["offline_groups"] if client else 0
        backends = [b for b in ("trackio", "tensorboard", "wandb") if getattr(cfg.log, b)]
        self.log = log = MetricsLog(self.out, console=self.console, every=cfg.log.every, backends=backends,
                                    config=cfg.model_dump(), enabled=self.policy.rank == 0,
                                    keep_lines=client["stream"].get("metrics_lines") if client else 0)
        offline = self._offline_groups(skip=self.offline_used,
                                       needed=start < cfg.offline.steps or bool(cfg.online.offline_fraction))
        if self.policy.rank == 0 and (cfg.online.steps or cfg.eval.limit):
            self.engine()  # started here, on the main thread, before the engine thread uses it
        self._sync(start)  # resumed (or a given engine): serve the checkpoint's weights, version = steps taken
        before = self._evaluate(0, log) if start == 0 else log.logged(0, "eval/")  # resumed: what the run measured
        producer = self._producer() if cfg.online.steps else None
        for step in range(start, cfg.total_steps):
            if self.worker.stopping.is_set():
                raise KeyboardInterrupt("the run is stopping")
            started = time.perf_counter()
            groups, rows = self._step_groups(step, offline, producer)
            metrics = self._train(step, groups, rows, started)
            log.log(step, metrics)
            self._stop_unless_finite(step, metrics)
            if self._evaluation_due(step):
                self._evaluate(step + 1, log)
            if self._checkpoint_due(step):
                self._checkpoint(step)
        steps = cfg.total_steps
        if start < steps and not self._checkpoint_due(steps - 1):  # else the loop saved the last step already
            self._checkpoint(steps - 1)
        exported = self.policy.export_hf(self.out / "model")
        after = self._evaluate(steps, log)
        plot = log.close()
        self.counts.update(self.stream_counts)
        after_offline = log.logged(cfg.offline.steps, "eval/") if self._offline_evaluated() else {}
        return TrainResult(steps, before, after, after_offline, exported, log.path, plot, dict(self.counts))

    def close(self) -> None:
        self.worker.close()
        if self._engine is not None and self._owns_engine:
            self._engine.close()
            self._engine = None

    # -- steps ------------------------------------------------------------------------------------

    def _step_groups(self, step: int, offline: Iterator[Group], producer) -> tuple[list[Group], list[dict]]:
        """This step's groups and every row sampled or read for it (the rows feed the env metrics)."""
        cfg, wanted = self.cfg, self.cfg.batch.groups_per_step
        if step < cfg.offline.steps:
            groups = self._take(offline, wanted)
            rows = list(self.offline_read)  # every row read, so zero-variance groups count too
            self.offline_read.clear()
            return groups, rows
        from_store = round(wanted * cfg.online.offline_fraction) if cfg.offline.sources else 0
        if (step - cfg.offline.steps) % cfg.online.sync_every == 0:
            self._sync(step)  # queued behind the rollouts planned before it
        rows = []
        if self.policy.rank == 0:
            self._plan_rollouts(step, producer, wanted - from_store)
            rows, self.online_metrics = self.worker.rows(step)
        rows = _broadcast(rows, self.policy.world_size)
        stream = GroupStream([rows], self.group_settings(), self.weights, seed=cfg.seed + step)
        fresh = list(stream)
        self._count(stream.counts)
        stale, lag = mask_stale(fresh, step, cfg.loss.max_staleness)  # stored groups are never "stale"
        self.online_metrics.update({"policy/stale_count": stale, "policy/staleness_max": lag})
        stored = self._take(offline, from_store)
        self.offline_read.clear()  # the env metrics of online steps are those of the policy's own rows
        return fresh + stored, rows

    def _plan_rollouts(self, step: int, producer, groups: int) -> None:
        """Queue the rollouts of steps up to `step + online.async_steps` (each sampled by the weights synced last)."""
        last = min(step + self.cfg.online.async_steps, self.cfg.total_steps - 1)
        for planned in range(max(step, self.worker.planned_until + 1), last + 1):
            self.worker.plan(planned, lambda s: self._produce_then_sleep(producer, s, groups))

    def _produce_then_sleep(self, producer, step: int, groups: int) -> list[dict]:
        """With vllm.enable_sleep_mode the engine sleeps from its rollouts to its next use (it wakes itself), so
        the optimizer steps meanwhile have the GPU memory it held."""
        try:
            return self._produce(producer, step, groups)
        finally:
            if self.cfg.vllm.enable_sleep_mode and self._engine is not None and self._engine.alive():
                self._engine.sleep()

    def _produce(self, producer, step: int, groups: int) -> list[dict]:
        """Fresh rows from the engine; a dead engine is restarted once with the current weights."""
        from hubgym.errors import EngineError, RolloutsStopped
        from hubgym.rollout.tokens import ChatRenderer

        engine = self.engine()
        try:
            return producer.produce(engine, ChatRenderer(engine.tokenizer), step, engine.policy_version, groups)
        except EngineError as exc:
            # A Ctrl-C also reaches vLLM's processes (one process group): the engine dies as the run stops.
            if self.worker.stopping.wait(timeout=self.STOPPING_GRACE_S):
                raise RolloutsStopped(f"online step {step}: the run is stopping; the engine was not restarted") from exc
            self.console.print(f"[yellow]vLLM engine failed ({escape(str(exc))}); "
                               "restarting it with the current weights")
            if not self._revive():  # alive but failing: start a fresh one all the same
                from hubgym.train.sync import restart_engine

                restart_engine(engine)
                self._count({"engine_restarts": 1})
            return producer.produce(engine, ChatRenderer(engine.tokenizer), step, engine.policy_version, groups)

    def _revive(self) -> bool:
        """Restart the engine if its process died (it then serves the last synced weights); True if it did."""
        from hubgym.errors import RolloutsStopped
        from hubgym.train.sync import ensure_engine

        if self._engine is None or self._engine.alive():
            return False
        if self.worker.stopping.wait(timeout=self.STOPPING_GRACE_S):  # vLLM died with the run's Ctrl-C
            raise RolloutsStopped("the run is stopping: the vLLM engine that died with it was not restarted")
        if not ensure_engine(self._engine):
            return False
        self.console.print("[yellow]the vLLM engine had died: restarted it with the last synced weights")
        self._count({"engine_restarts": 1})
        return True

    def _train(self, step: int, groups: list[Group], rows: list[dict], started: float) -> dict[str, Any]:
        from hubgym.train.evaluate import env_metrics

        cfg = self.cfg
        metrics: dict[str, Any] = env_metrics(rows)
        metrics["train/groups"] = len(groups)
        metrics["train/phase"] = 0 if step < cfg.offline.steps else 1
        if self.plan is not None:  # what the selection kept and dropped, and what re-scoring changed
            metrics.update(self.plan.metrics())
        metrics.update(self.online_metrics if metrics["train/phase"] else {})
        if not groups:  # every group was zero-variance or short: nothing to learn from at this step
            metrics["train/empty_step"] = 1
            return metrics
        mine = pack_step(groups, cfg.batch.micro_batch_tokens, self.policy.world_size)[self.policy.rank]
        for batch in mine if self.reference is not None else []:
            batch.ref_logprobs = self.reference.logprobs(batch)  # the same packed ids as the policy's forward
        stats = self.policy.train_step(mine, make_loss_fn(loss_settings(cfg)))
        seconds = time.perf_counter() - started
        metrics.update(without_empty_means(stats.metrics))
        metrics.update({"policy/loss": stats.loss, "policy/grad_norm": stats.grad_norm, "optim/lr": stats.lr,
                        "policy/skipped": float(stats.skipped), "time/step_s": seconds,
                        "time/train_s": stats.seconds, "time/tokens_per_s": stats.tokens / max(stats.seconds, 1e-9),
                        "train/tokens": stats.tokens})
        self.skip_reason = stats.skip_reason if stats.skipped else None
        if stats.skipped:
            self._count({"skipped_steps": 1})
        return metrics

    def _stop_unless_finite(self, step: int, metrics: dict[str, Any]) -> None:
        """A step with a loss or gradient norm that is not finite (DeepSpeed skipped it: weights untouched), or one
        that left a weight that is not, stops the run before it is checkpointed, synced or exported."""
        if metrics.get("train/empty_step"):
            return
        from hubgym.train.engine import SKIP_GRAD, SKIP_LOSS

        skipped = {SKIP_LOSS: "the loss", SKIP_GRAD: "the gradient norm"}.get(self.skip_reason)  # DeepSpeed's why
        what = skipped or (None if self.policy.weights_finite() else "a weight")
        if what is None:
            return
        from hubgym.errors import NonFiniteTrainingError

        kept = "the weights are those of the step before" if self.skip_reason else "nothing of this step was saved"
        raise NonFiniteTrainingError(f"step {step}: {what} is not finite, so the run stopped ({kept}; the last "
                                     f"checkpoint in {self.out / 'checkpoints'} is intact). Lower optim.lr (now "
                                     f"{self.cfg.optim.lr:g}) or clip harder (optim.max_grad_norm), check the rows "
                                     f"of this step, then run again to resume", step=step)

    # -- pieces -----------------------------------------------------------------------------------

    def _offline_groups(self, skip: int, needed: bool) -> Iterator[Group]:
        """Stored groups, cycling over the sources (a new seeded order each pass); `skip` resumes. With a selection
        or re-scoring (`offline.select`, `offline.rescore`) the sources are planned first (hubgym.score.select),
        when stored groups are `needed` at all: only the planned rows' groups are read, with re-scored rewards,
        and each group trains its selected rows (under grpo, with the advantages of the whole group)."""
        sources = self.cfg.offline.sources
        self.stream_counts: dict[str, int] = {}
        self.plan = self._plan() if needed else None
        settings = replace(self.group_settings(), objective=self.cfg.offline.loss)

        def rows(source: str) -> Iterator[dict]:
            from hubgym.hub.rollouts import iter_rollouts

            # a token id past the model's vocabulary would index nothing in its embedding: the reader refuses it
            for row in iter_rollouts([source], hub=self.hub, vocab_size=vocab_size(self.policy.module)):
                if self.plan is None:
                    yield row
                elif row.get("group") in self.plan.groups:
                    yield self.plan.row(row)

        def groups() -> Iterator[Group]:
            epoch = 0
            while sources:
                stream = GroupStream([rows(s) for s in sources], settings, self.weights, seed=self.cfg.seed + epoch,
                                     on_row=self.offline_read.append)
                produced = False
                for group in stream:
                    if self.plan is not None:
                        group = group.keep([self.plan.keeps(row.get("rollout_id")) for row in group.rows])
                    if group.rows:
                        produced = True
                        yield group
                for key, value in stream.counts.items():
                    self.stream_counts[f"offline/{key}"] = self.stream_counts.get(f"offline/{key}", 0) + value
                if not produced:  # a zero-row shard, rows of envs the config does not train, ...: one line
                    raise ConfigError(f"the offline sources {sources} hold no trainable group (all rows skipped, "
                                      f"zero-variance or short; counts: {stream.counts}); give offline.sources "
                                      f"whose rows are of the config's envs ({', '.join(sorted(self.weights))}) in "
                                      f"groups of grpo.n={self.cfg.grpo.n}, or set offline.steps=0")
                epoch += 1

        iterator = groups()
        for _ in range(skip):
            next(iterator)
        self.offline_read.clear()  # rows of steps trained before the checkpoint
        return iterator

    def _plan(self):
        """The offline selection planned over the sources (re-scored as asked), reported, and checked to keep rows
        the objective can learn from; None when no rule is on and nothing is re-scored."""
        o = self.cfg.offline
        if not o.sources or not o.selects:
            return None
        from hubgym.errors import SelectionError
        from hubgym.score.select import plan_selection

        choice = None
        if o.rescore:
            from hubgym.score.choice import VerifierChoice

            choice = VerifierChoice(o.verifier or None, o.env_revision or None, trust=self.trust, pin=self.pins,
                                    hub=self.hub)
        plan = plan_selection(o.sources, o.select, hub=self.hub, choice=choice, trust=self.trust, pins=self.pins)
        if self.policy.rank == 0:
            self.console.print(plan.table())
        plan.check_not_empty()
        if o.loss == "grpo" and plan.without_logprobs:
            env, rollout = plan.without_logprobs[0]
            raise SelectionError(f"{len(plan.without_logprobs)} of the {len(plan.kept)} selected stored rows have no "
                                 f"behaviour logprobs (env {env!r}, rollout {rollout!r} first: an imported run, or "
                                 f"another model's samples); offline.loss=grpo weighs each token by the policy's "
                                 f"ratio to them, so train these rows with offline.loss=sft")
        return plan

    def _take(self, offline: Iterator[Group], count: int) -> list[Group]:
        if count <= 0 or not self.cfg.offline.sources:
            return []
        taken = [next(offline) for _ in range(count)]
        self.offline_used += len(taken)
        return taken

    def _producer(self):
        from hubgym.engines import SamplingArgs
        from hubgym.train.online import OnlineProducer, difficulty_filter

        s = self.cfg.sampling
        return OnlineProducer(list(self.cfg.envs), split=self.cfg.online.split,
                              model=self.model_dir(), out_dir=self.out / "online", n=self.cfg.grpo.n,
                              sampling=SamplingArgs(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                                                    seed=self.cfg.seed),
                              max_model_len=self.cfg.online.max_model_len, seed=self.cfg.seed, hub=self.hub,
                              trust=self.trust, pins=self.pins, stop=self.worker.stopping,
                              chat_options=self._chat_options(),
                              task_filter=difficulty_filter(self.cfg.online, hub=self.hub))

    def _chat_options(self) -> dict[str, Any]:
        """How online and evaluation rollouts render and read the chat (train config `sampling`)."""
        s = self.cfg.sampling
        return {"tool_parser": s.tool_parser, "reasoning_parser": s.reasoning_parser,
                "chat_template_kwargs": s.chat_template_kwargs}

    def _sync(self, version: int) -> None:
        """Queue loading the current weights into vLLM as `version` (only when something samples: online steps
        or evaluation). With rollouts sampled ahead the weights are copied: the next step changes them in place."""
        if (not self.cfg.online.steps and not self.cfg.eval.limit) or self.synced == version:
            return
        from hubgym.train.sync import engine_dtype

        state = self.policy.full_state_dict(engine_dtype(self.engine()) if self.policy.rank == 0 else None)
        if self.policy.rank == 0:
            if self.cfg.online.async_steps:
                state = {name: tensor.detach().clone() for name, tensor in state.items()}
            self.worker.sync(self._sync_now, state, version)
        self.synced = version

    def _sync_now(self, state: dict, version: int) -> float:
        """On the engine thread: restart a dead engine, then load `state`; returns the seconds."""
        from hubgym.train.sync import sync_weights

        self._revive()
        if self.cfg.vllm.engine == "server":
            from hubgym.train.remote_sync import sync_remote_weights as sync_weights
        elif self.cfg.vllm.enable_sleep_mode:
            self.engine().wake_up()  # weights load into an awake engine only
        seconds = sync_weights(self.engine(), state, version, self.out / "sync")
        self._count({"weight_syncs": 1})
        return seconds

    def _evaluate(self, step: int, log: MetricsLog) -> dict[str, float]:
        from hubgym.train.evaluate import evaluate

        if not self.cfg.eval.limit:
            return {}
        self._sync(step)  # the weights of `step`, after the rollouts already planned
        if self.policy.rank != 0:
            return {}
        self.worker.drain()  # nothing else uses the engine while evaluating
        e = self.cfg.eval
        metrics = evaluate(self.engine(), self.eval_envs(), model=self.model_dir(),
                           out=self.out / "eval", step=step, split=e.split, limit=e.limit, n=e.n,
                           temperature=e.temperature, max_tokens=self.cfg.sampling.max_tokens, seed=self.cfg.seed,
                           max_model_len=self.cfg.online.max_model_len, hub=self.hub, trust=self.trust,
                           pins=self.pins, chat_options=self._chat_options())
        log.log(step, metrics)
        return metrics

    def _evaluation_due(self, step: int) -> bool:
        """Whether the held-out split is evaluated after `step` (every `eval.every` steps, and with
        `eval.after_offline` where the offline phase hands over to the online one); never after the last step,
        which the run evaluates anyway."""
        e, done = self.cfg.eval, step + 1
        if done >= self.cfg.total_steps:
            return False
        return bool(e.every and done % e.every == 0) or (done == self.cfg.offline.steps and self._offline_evaluated())

    def _offline_evaluated(self) -> bool:
        cfg = self.cfg
        return cfg.eval.after_offline and bool(cfg.eval.limit) and 0 < cfg.offline.steps < cfg.total_steps

    def _checkpoint_due(self, step: int) -> bool:
        """Whether the loop saves a checkpoint after `step` (every `checkpoint_every` steps)."""
        return bool(self.cfg.checkpoint_every) and (step + 1) % self.cfg.checkpoint_every == 0

    def _checkpoint(self, step: int) -> None:
        from hubgym.train.checkpoint import save_checkpoint

        if self.policy.rank == 0:
            self.worker.drain()  # rollouts planned for later steps are on disk: a resume reads them back
        position = {"offline_groups": self.offline_used, "metrics_lines": self.log.lines}
        save_checkpoint(self.policy, self.out / "checkpoints", step, position, keep=self.cfg.keep_checkpoints)
        if self.cfg.online.push and self.policy.rank == 0 and (self.out / "online" / "shards").exists():
            from hubgym.hub.rollouts import push_rollouts

            push_rollouts(self.out / "online", self.cfg.online.push, hub=self.hub, name="online")
        if self.cfg.offline.steps <= step + 1 < self.cfg.total_steps:
            # A run resumed from here can only put these weights into its engine, so the run that goes on
            # samples with them too, whatever `sync_every` says: both then sample the same rollouts.
            self._sync(step + 1)

    def _count(self, counts: dict[str, int]) -> None:
        for key, value in counts.items():
            self.counts[key] = self.counts.get(key, 0) + value


def vocab_size(module) -> int | None:
    """The token ids a model takes: the rows of its input embedding and of its output layer (the smaller)."""
    sizes = [getattr(layer, attr, None) for layer, attr in ((module.get_input_embeddings(), "num_embeddings"),
                                                            (module.get_output_embeddings(), "out_features"))]
    known = [size for size in sizes if isinstance(size, int)]
    return min(known) if known else None


def without_empty_means(metrics: dict[str, Any]) -> dict[str, Any]:
    """A step's loss metrics without the policy-gradient means when it had no such token (an SFT step): their
    placeholder values (ratio 1, entropy 0) describe nothing."""
    if metrics.get("policy/tokens", 1) > 0:
        return metrics
    means = ("policy/clip_frac", "policy/is_ratio", "policy/is_capped_frac", "policy/kl", "policy/entropy")
    return {k: v for k, v in metrics.items() if not k.startswith(means)}


def loss_settings(cfg: TrainConfig) -> LossSettings:
    """The loss as the config sets it (L of dr_grpo is the generation budget)."""
    c = cfg.loss
    return LossSettings(variant=c.variant, epsilon_low=c.epsilon_low, epsilon_high=c.epsilon_high, beta=c.beta,
                        is_cap=c.is_cap, dr_grpo_length=cfg.sampling.max_tokens, output_layer=c.output_layer)


def group_settings(cfg: TrainConfig) -> GroupSettings:
    g = cfg.grpo
    return GroupSettings(n=g.n, advantage=g.advantage, zero_variance=g.zero_variance,
                         zero_variance_weight=g.zero_variance_weight, short_groups=g.short_groups,
                         truncated=g.truncated, strict=g.strict, buffer_groups=cfg.batch.buffer_groups)


def deepspeed_settings(cfg: TrainConfig):
    """DeepSpeed as the config sets it (DeepSpeedSettings, imported when used: it imports torch)."""
    from hubgym.train.engine import DeepSpeedSettings

    from hubgym.train.lora import LoraSettings

    o, lora = cfg.optim, cfg.lora
    return DeepSpeedSettings(lr=o.lr, weight_decay=o.weight_decay, max_grad_norm=o.max_grad_norm,
                             zero_stage=o.zero_stage, bf16=o.bf16, gradient_checkpointing=o.gradient_checkpointing,
                             compile=o.compile,
                             schedule=o.schedule, warmup_steps=o.warmup_steps, total_steps=cfg.total_steps,
                             min_lr_ratio=o.min_lr_ratio, seed=cfg.seed,
                             lora=LoraSettings(r=lora.r, alpha=lora.alpha, dropout=lora.dropout,
                                               target_modules=tuple(lora.target_modules)))


def _broadcast(rows: list[dict], world_size: int) -> list[dict]:
    """Rank 0's rows on every rank (only rank 0 runs vLLM)."""
    if world_size == 1:
        return rows
    import torch

    box = [rows]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]
