"""A rollout run: tasks from any mixture of envs -> engine -> scored rows -> Arrow shards.

    config = RolloutConfig(envs=["arithmetic:easy", "wordle"], model="tiny-model", out="runs/r1", n=4, limit=8)
    summary = run_rollouts(config)
    config = RolloutConfig(envs=[], mix="mix.yaml", tasks=1000, model="tiny-model", out="runs/r2")  # a mixture

With `mix` (a spec file, see hubgym.mixture.spec), the run samples `tasks` draws of that mixture, seeded by
`sampling.seed`: only the env configs drawn are opened, and re-running draws the same tasks (so it resumes).

Workers split the tasks by a hash of the task id (`shard_index`/`num_shards`), so N workers
write disjoint shards with no coordinator. Re-running the same config resumes: groups whose
rollouts are already stored are skipped, so there is no duplicate and no missing rollout.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, Sequence

from hubgym.envs import OpenedEnv, open_env
from hubgym.envs.pins import parse_pins
from hubgym.engines import KINDS, Engine, EngineSettings, SamplingArgs, make_engine
from hubgym.engines.openai_client import MODES
from hubgym.rollout.interrupt import run_until_done_or_ctrl_c
from hubgym.rollout.loop import LoopContext, Trajectory, run_group
from hubgym.errors import ChatFormatError, SettingError
from hubgym.rollout.parsing import HERMES, check_parser_names
from hubgym.rollout.tokens import ChatRenderer, audit_tokens, check_chat_template_kwargs, recorded_options
from hubgym.rollout.writer import FLUSH_EVERY_S, PendingShard, ShardWriter, worker_name
from hubgym.schemas.rollouts import Rollout
from hubgym.schemas.tasks import Task
from hubgym.schemas.version import SCHEMA_VERSION
from hubgym.verifiers.contract import Score, Verifier, last_reply_cut


MAX_SAMPLES = 65_536
AT_MOST: dict[str, tuple[int, str]] = {
    "n": (MAX_SAMPLES, "the n samples of a task are one GRPO group, sampled together, held in memory and written into "
                       "one shard; sample more tasks instead"),
    "policy_version": (2**63 - 1, "rows store it as a 64-bit integer"),
}
"""Upper bounds, checked before any engine starts: a count past them would start vLLM and then never end."""


def check_at_most(name: str, value: int) -> None:
    """SettingError when `value` is past AT_MOST's bound for `name` (the command line's eval checks it too)."""
    high, why = AT_MOST.get(name, (None, ""))
    if high is not None and value > high:
        raise SettingError(f"{name}={value:,} is past the {high:,} hubgym takes: {why}", setting=name)


@dataclass
class RolloutConfig:
    """Everything that defines a rollout run (the run id is a hash of it, minus the worker fields)."""

    envs: list[str]  # "ENV" or "ENV:CONFIG"; ENV is a name, versioned id or path
    model: str  # model folder or name served at base_url
    out: str  # run folder
    engine: str = "vllm"  # "vllm" (offline, in-process) or "openai" (a server at base_url)
    vllm: EngineSettings = field(default_factory=EngineSettings)  # engine vllm: dtype, memory share, GPUs
    base_url: str | None = None
    mode: str = "tokens"  # openai engine only: "tokens" (token-in), "chat" or "chat_tokens" (native tool calls)
    n: int = 4  # samples per task: one GRPO group
    limit: int | None = None  # tasks per env (the first ones of the split)
    split: str = "test"
    sampling: SamplingArgs = field(default_factory=SamplingArgs)
    max_model_len: int | None = None  # context length; None: the model's own, as on the command line (one run id)
    policy_version: int = 0
    shard_index: int = 0
    num_shards: int = 1
    max_rows_per_shard: int = 512
    flush_every_s: float = FLUSH_EVERY_S  # finished groups reach disk within this many seconds, full shard or not
    concurrency: int = 256  # groups in flight (one vLLM batch at most; the memory bound of a run)
    hub: str | None = None  # where `org/name@revision` envs are loaded from (default: $HUBGYM_HUB or the local hub)
    trust: bool = False  # run hub verifiers unpinned (else each needs a pin)
    pins: dict[str, str] = field(default_factory=dict)  # hub repo -> "sha256:<hex>" of its verifier
    tool_parser: str = HERMES  # how replies' tool calls are read: "hermes" (<tool_call> JSON) or a vLLM parser name
    reasoning_parser: str | None = None  # a vLLM reasoning parser name: splits <think>...</think> into `reasoning`
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to every apply_chat_template
    mix: str | None = None  # a mixture spec file (YAML/JSON): draw `tasks` tasks from it instead of `envs`
    tasks: int | None = None  # with `mix`: how many tasks to draw (no task twice)

    def __post_init__(self) -> None:
        """What the command line bounds, held here for every way a config is made (`--set`, Python, Ray): a
        value that would sample nothing, write nothing or never end is one SettingError naming it."""
        at_least = {"n": 1, "limit": 1, "tasks": 1, "max_model_len": 16, "num_shards": 1, "shard_index": 0,
                    "max_rows_per_shard": 1, "concurrency": 1, "policy_version": 0}
        for name, low in at_least.items():
            value = getattr(self, name)
            if value is None and name in ("limit", "tasks", "max_model_len"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SettingError(f"{name}={value!r} must be a whole number >= {low}", setting=name)
            check_at_most(name, value)
        if self.shard_index >= self.num_shards:
            raise SettingError(f"shard_index={self.shard_index} must be below num_shards={self.num_shards} (worker i "
                               f"of N is shard_index i, 0 to N-1)", setting="shard_index")
        if not (isinstance(self.flush_every_s, (int, float)) and math.isfinite(self.flush_every_s)
                and self.flush_every_s > 0):
            raise SettingError(f"flush_every_s={self.flush_every_s!r} must be a finite number of seconds > 0",
                               setting="flush_every_s")
        if self.engine not in KINDS:
            raise SettingError(f"engine={self.engine!r}: use one of {', '.join(KINDS)}", setting="engine")
        if self.mode not in MODES:
            raise SettingError(f"mode={self.mode!r}: use one of {', '.join(MODES)}", setting="mode")
        self.pins = parse_pins(self.pins)  # the one pin rule: `REPO=sha256:<64 hex>`

    def run_id(self) -> str:
        # Where the run is written, how it is split and where the server listens do not change what it samples;
        # a model and context named as the command line names them (`local_model_resolved`) are the same run.
        keep = {k: v for k, v in asdict(local_model_resolved(self)).items()
                if k not in ("shard_index", "out", "concurrency", "base_url", "hub", "trust", "pins", "flush_every_s")}
        for name, default in (("tool_parser", HERMES), ("reasoning_parser", None), ("chat_template_kwargs", {}),
                              ("vllm", EngineSettings().to_dict())):
            if keep[name] == default:  # left out at their defaults: runs from before these options keep their ids
                del keep[name]
        if self.mix is None:
            del keep["mix"], keep["tasks"]
        else:  # the spec's content, not where the file lies, defines what is drawn
            from hubgym.mixture import load_mix_spec, spec_digest

            keep["mix"] = spec_digest(load_mix_spec(self.mix))
        return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def chat_options(self) -> dict[str, Any]:
        """tool_parser, reasoning_parser and chat_template_kwargs, as ChatRenderer takes them."""
        return {"tool_parser": self.tool_parser, "reasoning_parser": self.reasoning_parser,
                "chat_template_kwargs": self.chat_template_kwargs}

    def recorded_sampling(self) -> dict[str, Any]:
        """The sampling arguments plus the chat options that differ from the defaults (provenance and manifest)."""
        return {**self.sampling.to_dict(), **recorded_options(self.chat_options())}


def row_sampling(config: RolloutConfig, task: Task) -> dict[str, Any]:
    """The sampling that applied to one row: the run's, with the turn limit its interaction spec sets (a row's
    `max_tokens` wins over the run's, as the loop applies it)."""
    recorded = config.recorded_sampling()
    wanted = task["interaction"].get("max_tokens")
    return {**recorded, "max_tokens": wanted} if wanted else recorded


def mine(task_id: str, shard_index: int, num_shards: int) -> bool:
    """Deterministic task split across workers: a stable hash of the id, modulo the worker count."""
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) % num_shards == shard_index


def engine_for(config: RolloutConfig, **vllm_args: Any) -> Engine:
    """The engine a run samples with, built where every engine is (hubgym.engines.make_engine)."""
    return make_engine(config.engine, config.model, max_model_len=config.max_model_len, seed=config.sampling.seed,
                       settings=config.vllm, base_url=config.base_url, mode=config.mode, **vllm_args)


def check_chat_options(config: RolloutConfig) -> None:
    """Parser names vLLM knows and template kwargs that are a JSON object: checked before the engine starts."""
    check_chat_template_kwargs(config.chat_template_kwargs, "chat_template_kwargs")
    check_parser_names(config.tool_parser, config.reasoning_parser, tool_setting="tool_parser",
                       reasoning_setting="reasoning_parser")


def check_tools_rendered(renderer: ChatRenderer | None, envs: list[Any], model: str) -> None:
    """Refuse envs that offer tools when the model's chat template does not show them to the model.

    Such a template drops `tools` silently: the model would be scored on calls it was never told about.
    """
    if renderer is None or renderer.renders_tools:
        return
    for env in envs:
        tools = sorted({t for task in env.tasks for t in task["interaction"]["tools"] or []})
        if tools:
            raise ChatFormatError(
                f"env {env.env!r} offers tools ({', '.join(tools)}) but the chat template of model {model!r} ignores "
                f"`tools` (rendering with and without a tool gives the same prompt), so the model would never see "
                f"them; use a model whose chat template renders tools (e.g. a Qwen or Hermes template; "
                f"`--model tiny` has one), or leave out {env.env!r}", setting="--model")


def make_renderer(engine: Engine, model: str, *, tool_parser: str = HERMES, reasoning_parser: str | None = None,
                  chat_template_kwargs: dict[str, Any] | None = None) -> ChatRenderer | None:
    """The engine's tokenizer (else the model's) with the run's chat options; None for a chat-mode server whose
    tokenizer is not available here."""
    options = {"tool_parser": tool_parser, "reasoning_parser": reasoning_parser,
               "chat_template_kwargs": chat_template_kwargs}
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model)
        except OSError:
            if engine.token_in:
                raise
            return None
    return ChatRenderer(tokenizer, **options)


def rollout_id(run_id: str, task_id: str, sample: int) -> str:
    return f"{run_id}-{task_id}-{sample}"


def group_rows(trajs: list[Trajectory], verifier: Verifier, run_id: str, config: RolloutConfig, engine: Engine,
               renderer: ChatRenderer | None, env_repo: str | None = None,
               env_revision: str | None = None) -> list[Rollout]:
    """Score a group's trajectories in one batch (`Verifier.score_batch`: batch rewards get the group in one call)
    and lay each out as a Rollout row (`to_row`); a row's `score_s` is its share of the batch's time."""
    done = [t for t in trajs if t.error is None]  # a failed trajectory is not scored
    started = time.perf_counter()
    cuts = [last_reply_cut(t.completion, t.finish_reason, len(t.step_rewards)) for t in done]
    scores = dict(zip(map(id, done), verifier.score_batch([t.task for t in done], [t.completion for t in done], cuts)))
    share = (time.perf_counter() - started) / max(len(done), 1)
    return [to_row(t, verifier, run_id, config, engine, renderer, env_repo, env_revision,
                   scored=(scores.get(id(t)), share if t.error is None else 0.0)) for t in trajs]


def to_row(traj: Trajectory, verifier: Verifier, run_id: str, config: RolloutConfig, engine: Engine,
           renderer: ChatRenderer | None, env_repo: str | None = None, env_revision: str | None = None, *,
           scored: tuple[Score | None, float] | None = None) -> Rollout:
    """Lay a trajectory out as a Rollout row, scored alone unless `scored` gives its (score, seconds) from a batch
    (`group_rows`). A failed trajectory keeps reward None."""
    if scored is None:
        started = time.perf_counter()
        cut = last_reply_cut(traj.completion, traj.finish_reason, len(traj.step_rewards))
        score = verifier.score(traj.task, traj.completion, cut=cut) if traj.error is None else None
        score_s = time.perf_counter() - started
    else:
        score, score_s = scored
    error = traj.error or (score.error if score else None)
    tokens = traj.tokens
    metrics = {f"reward/{k}": v for k, v in (score.components if score else {}).items()}
    metrics["success"] = float(score is not None and error is None and verifier.succeeded(score))
    metrics.update({"loop/tool_calls": traj.tool_calls, "loop/tool_errors": traj.tool_errors,
                    "loop/parse_errors": traj.parse_errors, "loop/empty_responses": traj.empty_responses})
    metrics.update({f"step/{i}/reward": r for i, r in enumerate(traj.step_rewards)})  # for replay
    row: Rollout = {
        "rollout_id": rollout_id(run_id, traj.task["id"], traj.sample), "run_id": run_id,
        "task_id": traj.task["id"], "env": traj.task["env"], "group": f"{run_id}-{traj.task['id']}",
        "sample": traj.sample, "prompt": traj.prompt, "completion": traj.completion, "info": traj.task["info"],
        "interaction": traj.task["interaction"], "prompt_ids": tokens.prompt_ids,
        "completion_ids": tokens.completion_ids, "completion_mask": tokens.mask,
        "completion_logprobs": tokens.logprobs, "tokens_consistent": tokens.consistent,
        "reward": score.reward if score and error is None else None,
        "metrics": [{"name": k, "value": float(v)} for k, v in metrics.items()],
        "finish_reason": traj.finish_reason, "truncated": traj.truncated, "num_turns": traj.num_turns,
        "error": error,
        "provenance": {
            "model": config.model, "policy_version": config.policy_version,
            "sampling": json.dumps(row_sampling(config, traj.task), sort_keys=True), "env_repo": env_repo,
            "env_revision": env_revision,
            "verifier_module": verifier.name, "verifier_sha256": verifier.sha256, "engine": engine.name,
            "engine_version": engine.version,
            "chat_template_sha256": renderer.template_sha256 if renderer else None,
            "env_code_sha256": verifier.code_sha256 or None,  # a hub env's pin (what score and replay need)
        },
        "timings": {"generate_s": traj.generate_s, "tools_s": traj.tools_s, "score_s": score_s,
                    "total_s": traj.generate_s + traj.tools_s + score_s},
        "created_at": dt.datetime.now(dt.timezone.utc),
    }
    if renderer is not None and row["tokens_consistent"]:  # the replay audit's very check, as the row is written
        tools = traj.toolbox.schemas() if traj.toolbox else None
        row["tokens_consistent"] = audit_tokens(row, renderer, tools).ok
    return row


def _early_renderer(config: RolloutConfig, engine: Engine | None) -> ChatRenderer | None:
    """The run's renderer from the given engine's tokenizer or the model folder, before any engine starts;
    None when neither is at hand (a served model's name): it is made once the engine is."""
    if engine is not None:
        return make_renderer(engine, config.model, **config.chat_options())
    if config.engine != "vllm" and not Path(config.model).is_dir():
        return None
    from transformers import AutoTokenizer

    try:
        return ChatRenderer(AutoTokenizer.from_pretrained(config.model), **config.chat_options())
    except OSError:
        return None


class RunListener(Protocol):
    """Told what a worker's bar shows (e.g. a cluster driver that draws one bar for all workers)."""

    def started(self, groups: int, stored: int) -> None:
        """This worker's groups, `stored` of them already on disk (resumed)."""

    def advanced(self, rows: Sequence[Rollout], tokens: int) -> None:
        """One group finished and buffered: its rows and the model tokens they sampled."""


@dataclass
class RunSummary:
    run_dir: Path
    run_id: str
    written: int  # rollouts written by this call
    skipped: int  # rollouts already stored (resume)
    shards: list[Path]
    seconds: float
    generated_tokens: int


def local_model_resolved(config: RolloutConfig) -> RolloutConfig:
    """A config as the command line makes it: a model hubgym makes here ('tiny', 'smollm2-135m') as its folder
    (made or converted on first use), and no `max_model_len` as the model's own context (its config.json's
    max_position_embeddings; a served model's: FALLBACK_CONTEXT). Runs record both, so a run started from Python and
    the same run from the command line have one run id."""
    from hubgym.models import FALLBACK_CONTEXT, LOCAL_NAMES, context_length, resolve_model

    if config.model in LOCAL_NAMES:
        config = replace(config, model=resolve_model(config.model, setting="model"))
    if config.max_model_len is None:
        own = context_length(config.model, None) if config.engine == "vllm" else FALLBACK_CONTEXT
        config = replace(config, max_model_len=own)
    return config


def run_rollouts(config: RolloutConfig, engine: Engine | None = None, progress: bool = True,
                 listener: RunListener | None = None) -> RunSummary:
    """Generate, score and store rollouts for every task of this worker; resumes a previous run. Ctrl-C stores
    the groups already finished and raises KeyboardInterrupt. `listener` hears what the progress bar shows.
    An engine given is the caller's to close; one this run starts closes with it."""
    config = local_model_resolved(config)
    run_id = config.run_id()
    check_chat_options(config)
    envs = load_run_envs(config)
    early = _early_renderer(config, engine)  # a parser that does not fit, or tools the template ignores: refused
    check_tools_rendered(early, envs, config.model)  # before vLLM starts and before the run folder is written
    # Before the engine starts: a folder of another run, or one another process writes, is refused at once.
    with ShardWriter(config.out, worker_name(config.shard_index, config.num_shards), run_id=run_id,
                     max_rows=config.max_rows_per_shard, flush_every_s=config.flush_every_s) as writer:
        done = writer.existing_ids()
        todo = [(e, t) for e in envs for t in e.tasks if mine(t["id"], config.shard_index, config.num_shards)
                and not all(rollout_id(run_id, t["id"], i) in done for i in range(config.n))]
        skipped = sum(1 for e in envs for t in e.tasks if mine(t["id"], config.shard_index, config.num_shards))
        skipped = (skipped - len(todo)) * config.n
        if not todo and engine is None and writer.manifest_is_current():  # a finished run: no engine to start
            return RunSummary(Path(config.out), run_id, 0, skipped, writer.shards(), 0.0, 0)
        owned = engine is None
        engine = engine or engine_for(config)
        try:
            renderer = make_renderer(engine, config.model, **config.chat_options())
            if early is None:
                check_tools_rendered(renderer, envs, config.model)
            started = time.perf_counter()
            stats = {"written": 0, "tokens": 0}
            try:
                interrupted = run_until_done_or_ctrl_c(
                    _generate_all(todo, config, engine, renderer, run_id, writer, stats, progress, envs, listener))
            finally:
                writer.flush()
                writer.write_manifest(_manifest(config, run_id, envs, engine, renderer, writer))
        finally:
            if owned:  # not left to the garbage collector: a core in this process would tear a later one down
                engine.close()
    if interrupted:  # after the flush: every finished group is stored, and the same config resumes the run
        raise KeyboardInterrupt
    return RunSummary(Path(config.out), run_id, stats["written"], skipped, writer.shards(),
                      time.perf_counter() - started, stats["tokens"])


def load_run_envs(config: RolloutConfig) -> list[OpenedEnv]:
    """The run's envs, each with its tasks: each `envs` spec's split (up to `limit`), or `tasks` draws of the `mix`
    spec (grouped by env config)."""
    if config.mix is None:
        envs = [open_env(spec, hub=config.hub, trust=config.trust, pins=config.pins) for spec in config.envs]
        for env in envs:
            env.take(config.split, config.limit)
        return envs
    from hubgym.errors import EnvContractError, Where
    from hubgym.mixture import Mixture, load_mix_spec

    if config.envs or not config.tasks:
        raise EnvContractError(f"a mixture run draws `tasks` tasks from its spec and names no envs (envs="
                               f"{config.envs}, tasks={config.tasks})", Where(field="mix"),
                               "give --mix SPEC with --tasks N, or ENV[:CONFIG]... without --mix")
    mixture = Mixture.from_spec(load_mix_spec(config.mix), split=config.split, seed=config.sampling.seed,
                                hub=config.hub, trust=config.trust, pins=config.pins)
    by_key: dict[str, OpenedEnv] = {}
    for drawn in mixture.take(config.tasks):
        env = by_key.setdefault(drawn.env.key, mixture.opened(drawn.env))
        env.tasks = [*(env.tasks or []), drawn.task]
    mixture.close()
    for env in by_key.values():
        env.check_tools(env.tasks, config.split)
    return list(by_key.values())


async def _generate_all(todo, config, engine, renderer, run_id, writer, stats, progress, envs, listener) -> None:
    from hubgym.rollout.progress import RolloutProgress

    pending = iter(todo)
    one_flush = asyncio.Lock()

    def store_shard(shard: PendingShard) -> None:  # in a thread: generation goes on while it is encoded and fsynced
        writer.write_shard(shard)
        writer.write_manifest(_manifest(config, run_id, envs, engine, renderer, writer))  # lists it at once

    async def store_due() -> None:
        while writer.due:  # groups that finished during a write may fill more than one shard
            async with one_flush:  # one write at a time; rows are taken only once it is this write's turn, so a
                shard = writer.take() if writer.due else None  # cancelled wait leaves them buffered for the end
                if shard is None:
                    return
                await asyncio.to_thread(store_shard, shard)

    async def by_time() -> None:  # groups finished while no other group finishes still reach disk in time
        while True:
            await asyncio.sleep(max(writer.flush_every_s / 4, 0.05))  # flush_every_s=0: every group, no busy loop
            await store_due()

    stored = sum(1 for e in envs for t in e.tasks if mine(t["id"], config.shard_index, config.num_shards)) - len(todo)
    if listener is not None:
        listener.started(len(todo) + stored, stored)
    with RolloutProgress(len(todo) + stored, config.n, stored=stored, enabled=progress) as bar:
        async def worker() -> None:
            # A bounded pool: `concurrency` workers pull groups one at a time, so only that many groups
            # (coroutines, trajectories, rows) exist at once, whatever the number of tasks.
            for env, task in pending:
                ctx = LoopContext(engine, renderer, config.sampling, env.verifier, config.max_model_len)
                trajs = await run_group(task, config.n, ctx)
                rows = group_rows(trajs, env.verifier, run_id, config, engine, renderer, env.repo, env.revision)
                writer.add_group(rows, flush=False)
                await store_due()
                tokens = sum(sum(r["completion_mask"]) for r in rows)
                stats["written"] += len(rows)
                stats["tokens"] += tokens
                bar.advance(rows, tokens)
                if listener is not None:
                    listener.advanced(rows, tokens)

        timer = asyncio.ensure_future(by_time())
        try:
            await asyncio.gather(*(worker() for _ in range(min(config.concurrency, len(todo)))))
        finally:
            timer.cancel()  # a write it started finishes in its thread before asyncio.run returns


def _manifest(config, run_id, envs, engine, renderer, writer) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION, "run_id": run_id, "worker": writer.worker,
        "model": config.model, "policy_version": config.policy_version, "sampling": config.recorded_sampling(),
        "engine": engine.name, "engine_version": engine.version,
        "chat_template_sha256": renderer.template_sha256 if renderer else None,
        "envs": {e.env: {**e.provenance(), "tasks": len(e.tasks)} for e in envs},
        "split": config.split, "n": config.n, "rows": writer.rows_written,
        "shards": [p.name for p in writer.shards()], "shard_files": writer.shard_files(),  # rows + sha256 each
        "updated_at": dt.datetime.now(dt.timezone.utc).isoformat(),
    }
