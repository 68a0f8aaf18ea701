"""Benchmark single-turn rollouts with the offline vLLM engine: hubgym against raw `LLM.generate`,
the cost of writing shards, and peak memory against the number of rollouts.

    python bench/bench_rollout.py            # full run (~8 min on 2 cores); updates bench/RESULTS.md
    python bench/bench_rollout.py --quick    # smaller workloads (~3 min)
    python bench/bench_rollout.py --model smollm2-135m   # a real model: throughput only (~15 min on 2 cores)

One model and ONE `VLLMEngine` serve every measurement, in this process, so both sides share the
model, the engine settings and the machine state. `--model tiny` (the default) is the tiny local
model (hubgym.models.tiny) and runs all three parts below; `--model smollm2-135m` is
SmolLM2-135M-Instruct (hubgym.models.resolve_model, fp32, its own ChatML template) on
arithmetic:sums (its one-digit sums in plain words, the prompts that model answers), n=8, 48-token
replies, and runs the throughput part only, into its own section of bench/RESULTS.md:

1. Throughput. The same tasks go through (a) raw `engine.llm.generate`: one call with every
   prompt exactly as hubgym renders it (ChatRenderer -> token ids) and the same SamplingParams
   (n, temperature, top_p, max_tokens, per-request seeds, logprobs=0), built just before each pass
   (untimed, as run_rollouts builds its tasks before its loop); and (b) `run_rollouts`
   with that engine (looping, scoring, Arrow shards). After a warm-up of each, pairs of passes
   alternate their order (raw-hubgym, hubgym-raw, ...). Seeds are per request, so both sides sample
   the very same tokens (the benchmark checks the counts match). Tokens/s of a hubgym pass is its generated tokens over
   `RunSummary.seconds` (the rollout loop, writing included; building the task rows is reported
   apart, as "whole call"). Every pass starts with an empty prefix cache. The time spent inside
   vLLM's engine steps (`LLMEngine.step`, which both sides call: `LLM.generate` in a loop, hubgym
   from its serving thread) is measured too: the rest of hubgym's loop is time in which nothing
   stepped the engine, a number that the machine's noise blurs less than tokens/s.
2. Shard writing. ShardWriter's methods are wrapped with timers during each hubgym run: their
   time as a share of the run's wall time.
3. Memory. Peak RSS of this process and of vLLM's engine-core processes (psutil, sampled every
   20 ms) during runs of 1k and 20k rollouts (250 and 5000 tasks x n=4, 8-token replies), after
   a raw `LLM.generate` of the 20k workload, measured the same way, for reference.

The 5000 tasks come from `BenchArithmetic` below: the arithmetic env with a larger train split.
It is loaded by path like any user env (`bench/bench_rollout.py:bench`), which is why this file
defines exactly one TaskBuilder subclass.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: plenty for a 0.4M-parameter model
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from hubgym.builders.arithmetic import Arithmetic, ArithmeticConfig  # noqa: E402


class BenchArithmetic(Arithmetic):
    """The arithmetic env (2-digit + - *) with 5000 train tasks: enough for a 20k-rollout run."""

    BUILDER_CONFIGS = [ArithmeticConfig(name="bench", max_value=99, operators="+-*",
                                        sizes={"train": 5000, "test": 250})]
    GOLDEN = str(Arithmetic.source_dir() / Arithmetic.GOLDEN)


BENCH_ENV = f"{Path(__file__).resolve()}:bench"
from results import RESULTS, write_section  # noqa: E402  (bench/ is on sys.path when run as a script)
THROUGHPUT_HEADING = "## Rollouts: hubgym vs raw vLLM (single_turn, offline)"
REAL_HEADING = "## Rollouts: hubgym vs raw vLLM, SmolLM2-135M-Instruct (single_turn, offline)"
SHARDS_HEADING = "## Rollouts: shard writing cost and memory"


@dataclass
class Workload:
    envs: list[str]
    limit: int  # tasks per env
    n: int
    max_tokens: int
    split: str = "train"


@dataclass
class Plan:
    throughput: Workload
    pairs: int  # raw + hubgym passes, alternating
    memory_tasks: tuple[int, int] | None  # small and large run, x memory_n rollouts each; None: no memory part
    memory_n: int = 4
    memory_max_tokens: int = 8
    max_model_len: int = 1024
    model: str = "tiny"  # a name hubgym.models.resolve_model takes
    warm_tasks: int = 16  # tasks of each side's warm-up pass


def make_plan(quick: bool, model: str = "tiny") -> Plan:
    if model != "tiny":  # a real model on a CPU: ~100 generated tokens/s, so one workload, no memory runs
        work = Workload(["arithmetic:sums"], limit=16 if quick else 32, n=8, max_tokens=48)
        return Plan(work, pairs=2 if quick else 3, memory_tasks=None, max_model_len=512, model=model, warm_tasks=2)
    envs = ["arithmetic:medium", "reverse_text:sentences"]  # short and long prompts, both single_turn
    if quick:
        return Plan(Workload(envs, limit=48, n=4, max_tokens=64), pairs=3, memory_tasks=(50, 500))
    return Plan(Workload(envs, limit=150, n=4, max_tokens=64), pairs=5, memory_tasks=(250, 5000))


@dataclass
class WriteCost:
    seconds: float  # wall seconds inside ShardWriter (add_group, flush, manifest, ...)
    shards: int
    by_method: dict[str, float]
    cpu_seconds: float = 0.0  # CPU seconds of the threads running them
    writes: int = 0  # write_shard calls: a shard is written again while it is open (flush_every_s)
    rows_encoded: int = 0  # rows those writes encoded (each write encodes the open shard's rows so far)


@dataclass
class Pass:
    side: str  # "raw" | "hubgym"
    seconds: float  # raw: the generate call; hubgym: the rollout loop (RunSummary.seconds, writing included)
    call_seconds: float  # hubgym: the whole run_rollouts call (building task rows included)
    tokens: int
    rollouts: int
    steps: int = 0  # LLMEngine.step calls (each one a forward pass of the running batch)
    step_seconds: float = 0.0  # time inside them
    write: WriteCost | None = None
    load: float = 0.0  # 1-minute load average when the pass ended

    @property
    def tokens_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def outside_steps(self) -> float:
        """Share of the timed seconds in which this side was not stepping the engine."""
        return max(0.0, 1 - self.step_seconds / self.seconds)


@dataclass
class MemoryRun:
    tasks: int
    run: Pass
    main_before: int  # bytes of RSS
    main_peak: int
    core_before: int  # vLLM's engine-core processes, together
    core_peak: int


# -- the two sides ------------------------------------------------------------------------------


def make_engine(model_dir: Path, plan: Plan):
    from hubgym.models import resolve_model
    from hubgym.engines import VLLMEngine
    from hubgym.models.tiny import make_tiny_model

    folder = make_tiny_model(model_dir) if plan.model == "tiny" else resolve_model(plan.model)
    if plan.model != "tiny":  # 256 sequences of SmolLM2 (46 KiB of KV a token) need more than the tiny model's 1 GiB
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = "2"
    return VLLMEngine(str(folder), max_model_len=plan.max_model_len, seed=0)


def rollout_config(work: Workload, out: Path, max_model_len: int, model: str = "tiny"):
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig

    return RolloutConfig(envs=work.envs, model="tiny-model" if model == "tiny" else model, out=str(out), n=work.n,
                         limit=work.limit, split=work.split, sampling=SamplingArgs(max_tokens=work.max_tokens),
                         max_model_len=max_model_len)


def raw_inputs(config, engine) -> tuple[list[dict], list[Any]]:
    """The prompts and SamplingParams hubgym sends for each task's first (and only) turn."""
    from vllm import SamplingParams

    from hubgym.rollout.loop import request_seed
    from hubgym.envs import open_env
    from hubgym.rollout.tokens import ChatRenderer

    renderer, sampling = ChatRenderer(engine.tokenizer), config.sampling
    prompts, params = [], []
    for spec in config.envs:
        for task in open_env(spec).take(config.split, config.limit):
            interaction = task["interaction"]
            if interaction["kind"] != "single_turn" or interaction["tools"]:
                raise ValueError(f"task {task['id']} of {spec} is not a plain single_turn task")
            ids = renderer.prompt_ids(list(task["prompt"]), None)
            budget = min(interaction["max_tokens"] or sampling.max_tokens, engine.max_model_len - len(ids))
            prompts.append({"prompt_token_ids": ids})
            params.append(SamplingParams(n=config.n, temperature=sampling.temperature, top_p=sampling.top_p,
                                         max_tokens=budget, seed=request_seed(sampling.seed, task["id"], 0, 0),
                                         logprobs=0))
    return prompts, params


def raw_pass(engine, prompts: list[dict], params: list[Any]) -> Pass:
    engine.llm.reset_prefix_cache()  # every pass starts cold: no prompt of an earlier pass is cached
    steps = Timers(engine.llm.llm_engine, ("step",))
    started = time.perf_counter()
    with steps:
        outputs = engine.llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    completions = [c for out in outputs for c in out.outputs]
    return Pass("raw", seconds, seconds, sum(len(c.token_ids) for c in completions), len(completions),
                steps.calls, steps.seconds)


class Timers:
    """Wraps methods with timers for the length of a `with` block; the outermost call of a nest counts.

    Records wall seconds and the CPU seconds of the calling thread (`time.thread_time`): ShardWriter's
    flush runs in a thread beside generation, where its wall time includes waiting, not only working."""

    def __init__(self, owner: Any, names: tuple[str, ...]):
        self.owner, self.names = owner, names
        self.seconds, self.cpu_seconds, self.calls = 0.0, 0.0, 0
        self.by_name: dict[str, float] = {}  # outermost calls only
        self.count_by_name: dict[str, int] = {}  # every call, nested ones too
        self.rows_by_name: dict[str, int] = {}  # rows of a PendingShard argument (write_shard), every call
        self._saved: dict[str, Any] = {}
        self._local = threading.local()  # nesting depth per thread (flush runs in its own)
        self._lock = threading.Lock()

    def __enter__(self) -> "Timers":
        for name in self.names:
            self._saved[name] = self.owner.__dict__.get(name)
            setattr(self.owner, name, self._wrap(name, getattr(self.owner, name)))
        return self

    def __exit__(self, *exc) -> None:
        for name, method in self._saved.items():
            if method is None:
                delattr(self.owner, name)  # an instance attribute shadowed the class method
            else:
                setattr(self.owner, name, method)

    def _wrap(self, name: str, method: Callable) -> Callable:
        @functools.wraps(method)
        def timed(*args, **kwargs):
            depth = getattr(self._local, "depth", 0)
            self._local.depth = depth + 1
            rows = getattr(args[1], "rows", None) if len(args) > 1 else None
            with self._lock:
                self.count_by_name[name] = self.count_by_name.get(name, 0) + 1
                self.rows_by_name[name] = self.rows_by_name.get(name, 0) + len(rows or ())
            started, started_cpu = time.perf_counter(), time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                self._local.depth = depth
                if depth == 0:  # add_group calls flush: count the outer call only
                    seconds, cpu = time.perf_counter() - started, time.thread_time() - started_cpu
                    with self._lock:
                        self.calls += 1
                        self.seconds += seconds
                        self.cpu_seconds += cpu
                        self.by_name[name] = self.by_name.get(name, 0.0) + seconds
        return timed


def hubgym_pass(config, engine) -> Pass:
    from hubgym.rollout import run_rollouts
    from hubgym.rollout.writer import ShardWriter

    engine.llm.reset_prefix_cache()  # every pass starts cold: no prompt of an earlier pass is cached
    writer = Timers(ShardWriter, ("__init__", "existing_ids", "shards", "add_group", "take", "flush", "write_shard",
                                  "write_manifest"))
    steps = Timers(engine.llm.llm_engine, ("step",))  # called by the engine's serving thread only
    started = time.perf_counter()
    with writer, steps:
        summary = run_rollouts(config, engine=engine, progress=False)
    call = time.perf_counter() - started
    write = WriteCost(writer.seconds, len(summary.shards), dict(writer.by_name), writer.cpu_seconds,
                      writer.count_by_name.get("write_shard", 0), writer.rows_by_name.get("write_shard", 0))
    return Pass("hubgym", summary.seconds, call, summary.generated_tokens, summary.written, steps.calls,
                steps.seconds, write)


def run_throughput(engine, plan: Plan, work: Path, console) -> list[Pass]:
    config = rollout_config(plan.throughput, work / "unused", plan.max_model_len, plan.model)
    prompts, params = raw_inputs(config, engine)
    console.print(f"throughput: {len(prompts)} tasks x n={config.n}, max_tokens {config.sampling.max_tokens}, "
                  f"{plan.pairs} pairs of passes")
    warm_prompts = len(plan.throughput.envs) * plan.warm_tasks
    raw_pass(engine, prompts[:warm_prompts], params[:warm_prompts])  # warm-up: compiled shapes, imports, caches
    warm = Workload(plan.throughput.envs, plan.warm_tasks, plan.throughput.n, plan.throughput.max_tokens)
    hubgym_pass(rollout_config(warm, work / "warm-up", plan.max_model_len, plan.model), engine)
    passes = []
    for i in range(plan.pairs):  # raw-hubgym, hubgym-raw, ...: a drift in machine load hits both sides alike
        config = rollout_config(plan.throughput, work / f"hubgym-{i}", plan.max_model_len, plan.model)
        # Each raw pass builds its tasks and prompts first, untimed, as run_rollouts does before its loop:
        # building rows with `datasets` slows the generation that follows for a few seconds (measured: ~10%
        # here), so both sides start from the same state.
        pair = [lambda: raw_pass(engine, *raw_inputs(config, engine)), lambda: hubgym_pass(config, engine)]
        for run in pair if i % 2 == 0 else pair[::-1]:
            passes.append(run())
            passes[-1].load = os.getloadavg()[0]
        raw, hub = sorted(passes[-2:], key=lambda p: p.side != "raw")
        console.print(f"  pair {i + 1}: raw {raw.tokens_s:,.0f} tokens/s, hubgym {hub.tokens_s:,.0f} tokens/s, "
                      f"load average {os.getloadavg()[0]:.2f}")
        if raw.tokens != hub.tokens:
            console.print(f"[yellow]  the two sides generated {raw.tokens} and {hub.tokens} tokens[/yellow]")
    return passes


# -- memory -------------------------------------------------------------------------------------


class PeakRSS:
    """Samples the RSS of this process and of its children (vLLM's engine core) every `interval` s."""

    def __init__(self, interval: float = 0.02):
        import psutil

        self.interval, self.me = interval, psutil.Process()
        # Listed once: finding children scans every process on the machine, too slow for each sample.
        self.children = self.me.children(recursive=True)
        self.main_before, self.core_before = self._sample()
        self.main_peak, self.core_peak = self.main_before, self.core_before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> tuple[int, int]:
        import psutil

        core = 0
        for child in self.children:
            try:
                core += child.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return self.me.memory_info().rss, core

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            main, core = self._sample()
            self.main_peak, self.core_peak = max(self.main_peak, main), max(self.core_peak, core)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        main, core = self._sample()
        self.main_peak, self.core_peak = max(self.main_peak, main), max(self.core_peak, core)


def memory_run(engine, plan: Plan, tasks: int, out: Path, side: str = "hubgym") -> MemoryRun:
    """One measured run; side "raw" is `LLM.generate` on the same prompts (vLLM's own memory, for reference)."""
    gc.collect()
    config = rollout_config(Workload([BENCH_ENV], tasks, plan.memory_n, plan.memory_max_tokens), out,
                            plan.max_model_len)
    prompts, params = raw_inputs(config, engine) if side == "raw" else ([], [])
    with PeakRSS() as rss:
        run = raw_pass(engine, prompts, params) if side == "raw" else hubgym_pass(config, engine)
    return MemoryRun(tasks, run, rss.main_before, rss.main_peak, rss.core_before, rss.core_peak)


def run_memory(engine, plan: Plan, work: Path, console) -> list[MemoryRun]:
    """Raw generate on the large workload first: vLLM's worker grows while it meets new batch shapes
    (it does so under raw `LLM.generate` alike, then levels off), so the hubgym runs after it show
    what hubgym adds. Then the small and the large hubgym run."""
    small, large = plan.memory_tasks
    runs = [memory_run(engine, plan, large, work / "memory-raw", side="raw")]
    runs += [memory_run(engine, plan, tasks, work / f"memory-{tasks}") for tasks in (small, large)]
    for r in runs:
        console.print(f"memory: {r.run.side} {r.run.rollouts} rollouts in {r.run.seconds:.1f} s")
    return runs


# -- report -------------------------------------------------------------------------------------


MODEL_LABELS = {"tiny": "tiny 0.4M-parameter model", "smollm2-135m": "SmolLM2-135M-Instruct, 134.5M parameters, fp32"}


def machine(load: tuple[float, float] | None = None, model: str = "tiny") -> str:
    """The machine, and the 1-minute load average at the start and the end of the run (it is shared)."""
    import vllm

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    return (f"nproc {len(os.sched_getaffinity(0))}, {cpu}; Python {platform.python_version()}; "
            f"vllm {vllm.__version__} (vllm-cpu, {MODEL_LABELS.get(model, model)}); {datetime.date.today().isoformat()}"
            + (f"; load average {load[0]:.2f} at the start, {load[1]:.2f} at the end" if load else ""))


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def passes_table(passes: list[Pass]):
    from rich.table import Table

    table = Table("pass", "side", "rollouts", "generated tokens", "seconds", "tokens/s", "engine steps",
                  "seconds in engine steps", "share outside engine steps", "whole call seconds",
                  "load average after", title="throughput passes (alternating)")
    for i, p in enumerate(passes, 1):
        table.add_row(str(i), p.side, str(p.rollouts), str(p.tokens), f"{p.seconds:.2f}", f"{p.tokens_s:,.0f}",
                      str(p.steps), f"{p.step_seconds:.2f}", f"{100 * p.outside_steps:.1f}%", f"{p.call_seconds:.2f}",
                      f"{p.load:.1f}")
    return table


def ratio_table(passes: list[Pass]):
    from rich.table import Table

    raw = [p for p in passes if p.side == "raw"]
    hub = [p for p in passes if p.side == "hubgym"]
    pairs = [h.tokens_s / r.tokens_s for r, h in zip(raw, hub)]
    table = Table("measure", "raw tokens/s", "hubgym tokens/s", "hubgym / raw", title="hubgym / raw (target >= 0.9)")

    def row(name: str, r: float, h: float) -> None:
        table.add_row(name, f"{r:,.0f}", f"{h:,.0f}", f"{h / r:.3f}")

    median = statistics.median
    row("median of passes", median(p.tokens_s for p in raw), median(p.tokens_s for p in hub))
    row("best pass of each side", max(p.tokens_s for p in raw), max(p.tokens_s for p in hub))
    table.add_row("median of the pairs' ratios", "", "", f"{median(pairs):.3f}")
    row("whole call (task rows built inside), median", median(p.tokens / p.call_seconds for p in raw),
        median(p.tokens / p.call_seconds for p in hub))
    table.add_row("time outside engine steps, median (raw; hubgym)", "", "",
                  f"{100 * median(p.outside_steps for p in raw):.1f}%; "
                  f"{100 * median(p.outside_steps for p in hub):.1f}%")
    return table


def write_table(runs: list[tuple[str, Pass]]):
    from rich.table import Table

    table = Table("run", "rollouts", "shards", "shard writes (rows encoded)", "run seconds", "ShardWriter CPU seconds",
                  "CPU share of run", "ShardWriter wall seconds (flush in a thread)",
                  title="shard writing cost (target < 2%)")
    for name, p in runs:
        table.add_row(name, str(p.rollouts), str(p.write.shards), f"{p.write.writes} ({p.write.rows_encoded})",
                      f"{p.seconds:.2f}", f"{p.write.cpu_seconds:.3f}",
                      f"{100 * p.write.cpu_seconds / p.seconds:.2f}%", f"{p.write.seconds:.3f}")
    return table


def write_runs(passes: list[Pass], memory: list[MemoryRun], plan: Plan) -> list[tuple[str, Pass]]:
    hub = [p for p in passes if p.side == "hubgym"]
    runs = [(f"throughput pass {i + 1} ({plan.throughput.max_tokens}-token replies)", p) for i, p in enumerate(hub)]
    return runs + [(f"memory run ({plan.memory_max_tokens}-token replies)", m.run)
                   for m in memory if m.run.side == "hubgym"]


def memory_table(runs: list[MemoryRun]):
    from rich.table import Table

    table = Table("run", "tasks", "rollouts", "run seconds", "main RSS before (MiB)", "main RSS peak (MiB)",
                  "main growth (MiB)", "engine core before (MiB)", "engine core peak (MiB)",
                  "engine core growth (MiB)", title="peak memory of a rollout run")
    for r in runs:
        name = "raw LLM.generate" if r.run.side == "raw" else "hubgym run_rollouts"
        table.add_row(name, str(r.tasks), str(r.run.rollouts), f"{r.run.seconds:.1f}", mib(r.main_before),
                      mib(r.main_peak), mib(r.main_peak - r.main_before), mib(r.core_before), mib(r.core_peak),
                      mib(r.core_peak - r.core_before))
    return table


def markdown(table) -> str:
    """A rich table as a GitHub markdown table (the same cells)."""
    headers = [str(c.header) for c in table.columns]
    cells = [[str(c) for c in column.cells] for column in table.columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in zip(*cells)]
    return "\n".join(lines)


def verdict(passes: list[Pass]) -> str:
    raw = [p for p in passes if p.side == "raw"]
    hub = [p for p in passes if p.side == "hubgym"]
    pairs = statistics.median(h.tokens_s / r.tokens_s for r, h in zip(raw, hub))
    passes_ratio = statistics.median(p.tokens_s for p in hub) / statistics.median(p.tokens_s for p in raw)
    met = "met" if min(pairs, passes_ratio) >= 0.9 else ("met by one measure of two" if max(pairs, passes_ratio) >= 0.9
                                                        else "not met")
    return f"{met}: {pairs:.3f} by the median of the pairs' ratios, {passes_ratio:.3f} by the medians of the passes."


def write_results(path: Path, plan: Plan, passes: list[Pass], memory: list[MemoryRun], command: str,
                  load: tuple[float, float] | None = None) -> None:
    where, work = machine(load, plan.model), plan.throughput
    tasks = len(work.envs) * work.limit
    hub = [p for p in passes if p.side == "hubgym"]
    outside = statistics.median(p.outside_steps for p in hub)
    outside_raw = statistics.median(p.outside_steps for p in passes if p.side == "raw")
    concurrency = rollout_config(work, path, plan.max_model_len, plan.model).concurrency
    throughput = f"""Machine: {where}. Reproduce: `{command}`.

One `VLLMEngine` in one process. The same {tasks} single_turn tasks ({", ".join(work.envs)}, train split,
{work.limit} each) x n={work.n}, max_tokens {work.max_tokens}, temperature 1.0, per-request seeds: **raw** is one
`engine.llm.generate` call with the exact token ids and SamplingParams hubgym sends (its tasks are built and
rendered just before, untimed, as `run_rollouts` builds its tasks before its loop); **hubgym** is
`run_rollouts(config, engine=engine)` (looping, scoring, writing Arrow shards). A warm-up of each side,
then {plan.pairs} alternating pairs. Both sides sample the same tokens (same seeds). hubgym's tokens/s is over
`RunSummary.seconds` (the rollout loop, writing included); "whole call" also counts building the task rows
with `datasets` (every split of each config), which a run does once before generating.

{markdown(ratio_table(passes))}

{markdown(passes_table(passes))}

The machine is shared, so pass-to-pass noise is as large as hubgym's overhead: compare the median of the
pairs' ratios, or the share of each side's time in which nothing stepped vLLM's engine (`LLMEngine.step`,
one forward pass of the running batch, which both sides call): a median {100 * outside_raw:.1f}% for raw
`LLM.generate` (its own request handling) and {100 * outside:.1f}% for hubgym (rendering, the asyncio loop,
scoring, rows, shards). hubgym keeps up to `concurrency` ({concurrency}) groups in flight; `VLLMEngine`'s
serving thread adds each request to the engine as soon as a trajectory makes it and steps the engine
while any is unfinished (continuous batching, as vLLM's server does), so hubgym's own work overlaps generation.

Target (hubgym at least 0.9x raw): {verdict(passes)}"""
    if plan.memory_tasks is None:  # a real model: its throughput section only
        write_section(REAL_HEADING, throughput, path)
        return
    runs = write_runs(passes, memory, plan)
    hub_memory = [m for m in memory if m.run.side == "hubgym"]
    shards = f"""Machine: {where}. Reproduce: `{command}`.

Writing: ShardWriter's methods (`add_group`, `take`, `write_shard`, `write_manifest`, opening and resume checks) are
wrapped with timers inside each hubgym run above; their time is shown against the run's wall time
(`RunSummary.seconds`). Shards hold up to 512 rows; each is built as an Arrow table, written to a
temporary file, fsynced and renamed, then the manifest is rewritten the same way. The shard being filled
is also written when its oldest unwritten row has waited `flush_every_s` (5 s), and again, under the same
name and with all its rows so far, each time more are due, until it is full: "shard writes" counts every
write and the rows each one encoded (equal to the rollouts when no shard was written before it was full).
Writing happens in a thread while the other trajectories go on generating, so the cost to the run is the
CPU the writing takes (`time.thread_time` of the threads in ShardWriter's methods), not its wall time,
which includes waiting for the disk and for Python's lock.

{markdown(write_table(runs))}

Memory: peak RSS, sampled every 20 ms with psutil, of this process (hubgym + the vLLM front end) and of
vLLM's engine-core processes, during hubgym runs of {hub_memory[0].run.rollouts} and
{hub_memory[1].run.rollouts} rollouts ({hub_memory[0].tasks} and {hub_memory[1].tasks} arithmetic tasks
x n={plan.memory_n}, {plan.memory_max_tokens}-token replies), one after the other with the same engine,
after a raw `LLM.generate` of the large workload (vLLM's worker grows while it meets new batch shapes,
under raw generate as much, then levels off). "before" is the RSS when the run starts. A run keeps at
most `concurrency` groups in flight (a bounded pool of workers pulls tasks one at a time) and at most one
shard's rows buffered, so its memory does not grow with the number of rollouts; the task rows themselves
(a few hundred bytes each) are held for the run.

{markdown(memory_table(memory))}"""
    write_section(THROUGHPUT_HEADING, throughput, path)
    write_section(SHARDS_HEADING, shards, path)


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller workloads (~3 min)")
    parser.add_argument("--model", default="tiny", choices=sorted(MODEL_LABELS),
                        help="tiny: every part; smollm2-135m: SmolLM2-135M-Instruct, throughput only")
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "hubgym-bench-tiny-model",
                        help="where the tiny model is made (reused when complete)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results file; only this benchmark's sections change")
    parser.add_argument("--no-write", action="store_true", help="print the tables, leave the results file alone")
    args = parser.parse_args()
    import datasets
    from rich.console import Console

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    console = Console(width=150)
    plan, started, load_start = make_plan(args.quick, args.model), time.perf_counter(), os.getloadavg()[0]
    engine = make_engine(args.model_dir, plan)
    console.print(f"engine ready in {time.perf_counter() - started:.0f} s")
    with tempfile.TemporaryDirectory(prefix="hubgym-bench-rollout-") as tmp:
        passes = run_throughput(engine, plan, Path(tmp), console)
        memory = run_memory(engine, plan, Path(tmp), console) if plan.memory_tasks else []
    console.print(ratio_table(passes), passes_table(passes), write_table(write_runs(passes, memory, plan)))
    console.print(*([memory_table(memory)] if memory else []),
                  f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    if not args.no_write:
        command = ("python bench/bench_rollout.py" + (" --quick" if args.quick else "")
                   + (f" --model {args.model}" if args.model != "tiny" else ""))
        write_results(args.out, plan, passes, memory, command, (load_start, os.getloadavg()[0]))
        console.print(f"wrote {args.out}")
    console.print(f"total {time.perf_counter() - started:.0f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
