"""Fresh rollouts of the policy being trained: the live producer of the online phase.

Each call to `produce(engine, renderer, step, version, groups)` draws tasks from the env mixture (seeded, without
repeats within a step), samples one GRPO group per task with the vLLM engine that serves the
current weights, scores the rows, and writes them as shards of one run folder OUT (step k writes as
worker `step<k>`) before handing them to the trainer. So the online data is on disk (and can go to
the Hub) exactly like any other rollout run, with `policy_version` in every row.

Resume: if OUT already holds a complete step (its manifest says so) of this very run (model, envs,
sampling and n give the stored run id), the stored rows are returned instead of sampling again, so a
resumed run trains on the very same batches as the run that was killed, whatever weights it serves now
(rollouts sampled ahead were sampled by older ones). A complete step of another run is refused rather
than trained on. Stopping: once the `stop` event is set (the trainer is closing, e.g. after
Ctrl-C), a step being sampled is cancelled at once, its vLLM requests aborted and nothing of it written; a
resumed run samples that step again.

The tasks come from a `hubgym.mixture.Mixture` over the `envs` entries (names, or family/tag selectors with
weights): env configs are opened only when drawn, an LRU bounds the open ones, and nothing per env is built up
front. The stream's state after each step (draw count and per-env positions, a few bytes per env config ever
drawn) is stored in that step's manifest, so step s draws from the state step s-1 left on disk: a resumed run
draws exactly what the killed one would have. With a task filter (`online.difficulty_stats`, a
`hubgym.stats.DifficultyBand`), the filter takes in every step's rows once it is written (or read back), and a
resumed run feeds it the rows of every stored step before its first draw, so it holds what it held then.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from hubgym.envs import OpenedEnv
from hubgym.errors import RolloutsStopped
from hubgym.hub.rollouts import iter_rollouts
from hubgym.mixture import EnvConfig, MixEntry, Mixture, MixSpec, TaskFilter, parse_spec
from hubgym.engines import Engine, SamplingArgs
from hubgym.rollout.interrupt import run_coroutine
from hubgym.rollout.loop import LoopContext, run_group
from hubgym.rollout.run import RolloutConfig, check_tools_rendered, group_rows
from hubgym.rollout.tokens import ChatRenderer, recorded_options
from hubgym.rollout.runlock import RunLock
from hubgym.rollout.writer import ShardWriter
from hubgym.train.config import ConfigError

EnvsArgument = list[tuple[str, float]] | list[dict[str, Any]] | list[MixEntry]


def mixture_spec(envs: EnvsArgument) -> MixSpec:
    """The mixture of the `envs` argument: (spec, weight) pairs as ever, or entries with selectors."""
    entries: list[Any] = []
    for item in envs:
        if isinstance(item, tuple):
            name, weight = item
            if name is None:
                raise ConfigError("an envs entry without a name reached the online producer as (name, weight); "
                                  "pass the entries themselves (EnvMix.model_dump()) so source/tag selectors expand")
            entries.append({"name": name, "weight": weight})
        else:
            entries.append(item.model_dump(exclude_none=True) if isinstance(item, MixEntry) else item)
    return parse_spec({"envs": entries}, origin="the train config's envs")


def difficulty_filter(online: Any, hub: str | None = None) -> TaskFilter | None:
    """The train config's difficulty band (`online.difficulty_stats`, `online.pass_band`), or None when unset.

    `hubgym.stats.DifficultyBand` is imported here, when a band is asked for, so a run without one never needs
    it. Pass the result to OnlineProducer(task_filter=...)."""
    if not online.difficulty_stats and tuple(online.pass_band) == (0.0, 1.0):
        return None
    from hubgym.stats import DifficultyBand

    low, high = online.pass_band
    return DifficultyBand.from_sources(list(online.difficulty_stats), low=low, high=high,
                                       min_samples=online.difficulty_min_samples, hub=hub)


class OnlineProducer:
    STOP_POLL_S = 0.05  # how often a step being sampled looks at the stop event

    def __init__(self, envs: EnvsArgument, *, split: str, model: str, out_dir: str | Path, n: int,
                 sampling: SamplingArgs, max_model_len: int, seed: int = 0, hub: str | None = None, trust: bool = False,
                 pins: dict[str, str] | None = None, stop: threading.Event | None = None,
                 chat_options: dict[str, Any] | None = None, task_filter: TaskFilter | None = None,
                 listing: Any = None, max_open: int | None = None):
        self.spec = mixture_spec(envs)
        options = {"max_open": max_open} if max_open else {}
        self.mixture = Mixture.from_spec(self.spec, split=split, seed=seed, listing=listing, task_filter=task_filter,
                                         hub=hub, trust=trust, pins=pins, **options)
        self.task_filter = task_filter
        self.split, self.model, self.out_dir, self.n = split, model, Path(out_dir), n
        self.sampling, self.max_model_len, self.seed = sampling, max_model_len, seed
        self.stop = stop if stop is not None else threading.Event()
        # tool_parser, reasoning_parser, chat_template_kwargs (train config `sampling`): how the policy's chat is
        # rendered and read; in the run id and provenance, as a `hubgym rollout` run records them.
        self.chat_options = dict(chat_options or {})
        self._renderer: ChatRenderer | None = None
        self._state_step: int | None = None  # the step the mixture's in-memory state is ready to draw
        self._filtered: set[int] = set()  # steps whose rows the task filter has taken in
        self._after: tuple[int, dict[str, Any]] | None = None  # (step, the stream's state after its draw)

    def pick(self, step: int, groups: int) -> list[tuple[OpenedEnv, dict]]:
        """Tasks for one step: `groups` draws of the mixture by weight, no task twice in a step.

        The draw continues the stream from where step - 1 left it: in memory, or the state stored in step - 1's
        manifest (the first online step starts the stream). The state after the draw is what `produce` stores in
        this step's manifest; a step that is cancelled stores nothing, and drawing it again gives the same tasks.
        """
        self._ready_for(step)
        drawn = self.mixture.take(groups)
        self._after = (step, self.mixture.state())
        picks = []
        for d in drawn:
            opened = self.mixture.opened(d.env)
            opened.check_tools([d.task], self.split)  # a row offering a tool that resolves nowhere: before sampling
            picks.append((opened, d.task))
        return picks

    def _ready_for(self, step: int) -> None:
        """Put the mixture (and the task filter) where the stream stands before `step`."""
        self._feed_filter(step)
        if self._state_step == step:
            self.mixture.restore(self._state_before)
            return
        stored = [(t, m) for t, m in self._manifests() if t < step and "mixture" in m]
        state = stored[-1][1]["mixture"] if stored else {"draws": 0, "positions": {}}
        self.mixture.restore(state)
        self._state_step, self._state_before = step, state

    def _commit(self, step: int, state: dict[str, Any]) -> None:
        self._state_step, self._state_before = step + 1, state

    def _manifests(self) -> list[tuple[int, dict[str, Any]]]:
        """(step, manifest) of every complete step in OUT, by step."""
        found = []
        for path in self.out_dir.glob("manifest-step*.json"):
            record = json.loads(path.read_text())
            if record.get("complete") and isinstance(record.get("step"), int):
                found.append((record["step"], record))
        return sorted(found, key=lambda item: item[0])

    def _feed_filter(self, step: int) -> None:
        """The task filter takes in every stored step before `step` it has not seen, in step order."""
        if self.task_filter is None:
            return
        for stored, _ in self._manifests():
            if stored < step and stored not in self._filtered:
                self._updated_filter(stored, self._stored_rows(stored))

    def _updated_filter(self, step: int, rows: list[dict[str, Any]]) -> None:
        if self.task_filter is not None and step not in self._filtered:
            if rows:  # a step whose groups all failed to sample has nothing to learn from
                self.task_filter.update(rows)
            self._filtered.add(step)

    def envs_offering_tools(self) -> list[Any]:
        """The mixture's env configs whose rows may offer tools (from the listing: nothing is opened), shaped as
        check_tools_rendered reads envs."""
        return [_ToolsOffered(e) for e in self.mixture.envs if e.tools]

    def rollout_config(self, step: int, version: int) -> RolloutConfig:
        return RolloutConfig(envs=[e.label() for e in self.spec.envs], model=self.model, out=str(self.out_dir),
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
            check_tools_rendered(self._renderer, self.envs_offering_tools(), self.model)
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
            self._feed_filter(step)  # steps before it first: the filter takes steps in order
            self._updated_filter(step, stored)
            return stored
        for stale in (self.out_dir / "shards").glob(f"{self.worker(step)}-*.arrow"):  # killed before its manifest
            stale.unlink()
        renderer = self.renderer(renderer)
        config, picks = self.rollout_config(step, version), self.pick(step, groups)
        run_id = config.run_id()
        rows = run_coroutine(self._sample(engine, renderer, config, run_id, picks))
        if rows is None:
            raise RolloutsStopped(f"online step {step}: rollouts cancelled, the run is stopping; nothing was stored")
        writer = ShardWriter(config.out, self.worker(step), max_rows=max(len(rows), 1), lock=False)
        writer.add_group(rows, flush=False)
        shard = writer.take()  # in stored order, so a resumed run that reads them back streams the same order
        writer.write_shard(shard)
        rows = shard.rows if shard else []
        envs: dict[str, dict[str, Any]] = {}
        for e, _ in picks:  # the env configs this step drew (a mixture of 1,000 lists only those)
            envs.setdefault(e.env, {**e.provenance(), "tasks": 0})["tasks"] += 1
        drawn_step, state = self._after
        writer.write_manifest({"run_id": run_id, "step": step, "policy_version": version, "rows": len(rows),
                               "complete": True, "model": self.model, "sampling": config.recorded_sampling(),
                               "envs": envs, "mixture": state, "shards": [p.name for p in writer.shards()]})
        self._commit(drawn_step, state)
        self._updated_filter(step, rows)
        return rows

    async def _sample(self, engine, renderer, config: RolloutConfig, run_id: str,
                      picks) -> list[dict[str, Any]] | None:
        """The picks' groups as rows, in pick order; None if `stop` was set before they were done."""
        async def one(env: OpenedEnv, task: dict) -> list[dict[str, Any]]:
            ctx = LoopContext(engine, renderer, config.sampling, env.verifier, config.max_model_len)
            trajs = await run_group(task, config.n, ctx)
            return group_rows(trajs, env.verifier, run_id, config, engine, renderer, env.repo, env.revision)

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
        return self._stored_rows(step)

    def _stored_rows(self, step: int) -> list[dict[str, Any]]:
        shards = sorted((self.out_dir / "shards").glob(f"{self.worker(step)}-*.arrow"))
        return list(iter_rollouts(shards)) if shards else []


@dataclass
class _ToolsOffered:
    """An env config that offers tools, as check_tools_rendered reads an env (its name and rows' tools)."""

    config: EnvConfig

    @property
    def env(self) -> str:
        return self.config.name

    @property
    def tasks(self) -> list[dict[str, Any]]:
        return [{"interaction": {"tools": list(self.config.tools)}}]
