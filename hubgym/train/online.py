"""Fresh rollouts of the policy being trained: the live producer of the online phase.

Each call to `produce(engine, renderer, step, version, groups)` draws tasks from the env mixture (seeded, without
repeats within a step), samples one GRPO group per task with the vLLM engine that serves the
current weights, scores the rows, and writes them as shards of one run folder OUT (step k writes as worker `step<k>`) before
handing them to the trainer. So the online data is on disk (and can go to the Hub) exactly like
any other rollout run, with `policy_version` in every row.

Resume: if OUT already holds a complete step (its manifest says so) of this very run (model, envs,
sampling and n give the stored run id), the stored rows are returned instead of sampling again, so a
resumed run trains on the very same batches as the run that was killed, whatever weights it serves now
(rollouts sampled ahead were sampled by older ones). A complete step of another run is refused rather
than trained on. Stopping: once the `stop` event is set (the trainer is closing, e.g. after
Ctrl-C), a step being sampled is cancelled at once, its vLLM requests aborted and nothing of it written; a
resumed run samples that step again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from hubgym.errors import RolloutsStopped
from hubgym.hub.rollouts import iter_rollouts
from hubgym.resolve import EnvTasks, load_env_tasks
from hubgym.rollout.engines import Engine, SamplingArgs
from hubgym.rollout.loop import LoopContext, run_group
from hubgym.rollout.run import RolloutConfig, check_tools_rendered, to_row
from hubgym.rollout.tokens import ChatRenderer, recorded_options
from hubgym.rollout.runlock import RunLock
from hubgym.rollout.writer import ShardWriter
from hubgym.train.config import ConfigError


@dataclass
class MixEnv:
    tasks: EnvTasks
    weight: float
    spec: str


class OnlineProducer:
    STOP_POLL_S = 0.05  # how often a step being sampled looks at the stop event

    def __init__(self, envs: list[tuple[str, float]], *, split: str, model: str, out_dir: str | Path, n: int,
                 sampling: SamplingArgs, max_model_len: int, seed: int = 0, hub: str | None = None, trust: bool = False,
                 pins: dict[str, str] | None = None, stop: threading.Event | None = None,
                 chat_options: dict[str, Any] | None = None):
        self.envs = [MixEnv(load_env_tasks(spec, split, None, hub=hub, trust=trust, pins=pins), weight, spec)
                     for spec, weight in envs]
        self.split, self.model, self.out_dir, self.n = split, model, Path(out_dir), n
        self.sampling, self.max_model_len, self.seed = sampling, max_model_len, seed
        self.stop = stop if stop is not None else threading.Event()
        # tool_parser, reasoning_parser, chat_template_kwargs (train config `sampling`): how the policy's chat is
        # rendered and read; in the run id and provenance, as a `hubgym rollout` run records them.
        self.chat_options = dict(chat_options or {})
        self._renderer: ChatRenderer | None = None

    def pick(self, step: int, groups: int) -> list[tuple[MixEnv, dict]]:
        """Tasks for one step: groups split across envs by weight, no task twice in a step.

        The draw depends only on (seed, step), not on an RNG carried across steps, so a resumed
        run draws the same tasks with no state to checkpoint.
        """
        rng = random.Random(f"{self.seed}:{step}")
        chosen_envs = rng.choices(self.envs, weights=[e.weight for e in self.envs], k=groups)
        picks: list[tuple[MixEnv, dict]] = []
        for env in self.envs:
            count = sum(1 for e in chosen_envs if e is env)
            pool = list(range(len(env.tasks.tasks)))
            indices = rng.sample(pool, min(count, len(pool)))
            picks += [(env, env.tasks.tasks[i]) for i in indices]
        return picks

    def rollout_config(self, step: int, version: int) -> RolloutConfig:
        return RolloutConfig(envs=[e.spec for e in self.envs], model=self.model, out=str(self.out_dir),
                             n=self.n, split=self.split, policy_version=version, max_model_len=self.max_model_len,
                             sampling=SamplingArgs(**{**self.sampling.to_dict(), "seed": self.seed + step}),
                             **self.chat_options)

    def renderer(self, given: ChatRenderer) -> ChatRenderer:
        """The trainer's renderer with this run's chat options (made once); envs whose tools the template
        ignores are refused here, before the first step samples anything."""
        if self._renderer is None or self._renderer.tokenizer is not given.tokenizer:
            options = self.rollout_config(0, 0).chat_options()
            self._renderer = given if given.chat_options() == recorded_options(options) else ChatRenderer(
                given.tokenizer, **options)
            check_tools_rendered(self._renderer, [e.tasks for e in self.envs], self.model)
        return self._renderer

    @staticmethod
    def worker(step: int) -> str:
        """Each step writes as its own "worker" of one run folder, so OUT is a normal rollout run."""
        return f"step{step:06d}"

    def produce(self, engine: Engine, renderer: ChatRenderer, step: int, version: int,
                groups: int) -> list[dict[str, Any]]:
        """One step's rows (complete groups) sampled by policy `version`, or read back after a resume. OUT is
        locked from the check for stored rows to the write: another trainer writing OUT is refused, not mixed in."""
        with RunLock(self.out_dir, "online"):
            return self._produce(engine, renderer, step, version, groups)

    def _produce(self, engine: Engine, renderer: ChatRenderer, step: int, version: int,
                 groups: int) -> list[dict[str, Any]]:
        stored = self._stored(step)
        if stored is not None:
            return stored
        for stale in (self.out_dir / "shards").glob(f"{self.worker(step)}-*.arrow"):  # killed before its manifest
            stale.unlink()
        renderer = self.renderer(renderer)
        config, picks = self.rollout_config(step, version), self.pick(step, groups)
        run_id = config.run_id()
        rows = asyncio.run(self._sample(engine, renderer, config, run_id, picks))
        if rows is None:
            raise RolloutsStopped(f"online step {step}: rollouts cancelled, the run is stopping; nothing was stored")
        writer = ShardWriter(config.out, self.worker(step), max_rows=max(len(rows), 1), lock=False)
        writer.add_group(rows, flush=False)
        shard = writer.take()  # in stored order, so a resumed run that reads them back streams the same order
        writer.write_shard(shard)
        rows = shard.rows if shard else []
        envs = {e.tasks.env: {"config": e.tasks.config, "tasks": len(e.tasks.tasks),
                              "verifier_module": e.tasks.verifier.name, "verifier_sha256": e.tasks.verifier.sha256,
                              "env_repo": e.tasks.repo, "env_revision": e.tasks.revision} for e in self.envs}
        writer.write_manifest({"run_id": run_id, "step": step, "policy_version": version, "rows": len(rows),
                               "complete": True, "model": self.model, "sampling": config.recorded_sampling(),
                               "envs": envs, "shards": [p.name for p in writer.shards()]})
        return rows

    async def _sample(self, engine, renderer, config: RolloutConfig, run_id: str,
                      picks) -> list[dict[str, Any]] | None:
        """The picks' groups as rows, in pick order; None if `stop` was set before they were done."""
        async def one(env: MixEnv, task: dict) -> list[dict[str, Any]]:
            ctx = LoopContext(engine, renderer, config.sampling, env.tasks.verifier, config.max_model_len)
            trajs = await run_group(task, config.n, ctx)
            return [to_row(t, env.tasks.verifier, run_id, config, engine, renderer, env.tasks.repo, env.tasks.revision)
                    for t in trajs]

        sampling = asyncio.gather(*(one(env, task) for env, task in picks))
        while not self.stop.is_set():
            done, _ = await asyncio.wait({sampling}, timeout=self.STOP_POLL_S)
            if done:
                return [row for group in sampling.result() for row in group]
        sampling.cancel()  # each waiting engine request is aborted
        with contextlib.suppress(asyncio.CancelledError):
            await sampling
        return None

    def _stored(self, step: int) -> list[dict[str, Any]] | None:
        manifest = self.out_dir / f"manifest-{self.worker(step)}.json"
        record = json.loads(manifest.read_text()) if manifest.exists() else {}
        if not record.get("complete"):
            return None
        expected = self.rollout_config(step, record.get("policy_version", 0)).run_id()
        if record.get("run_id") != expected:
            raise ConfigError(f"{self.out_dir} already holds online step {step} of another run (run id "
                              f"{record.get('run_id')}, this config's is {expected}: another model, envs, sampling "
                              f"or group size); train into a new output_dir, or delete {self.out_dir} (and the "
                              f"checkpoints beside it) to start over")
        shards = sorted((self.out_dir / "shards").glob(f"{self.worker(step)}-*.arrow"))
        return list(iter_rollouts(shards))
