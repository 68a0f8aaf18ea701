"""Check many envs at once: one process per env, `jobs` at a time, each with a time limit.

    results = check_many(["arithmetic", "wordle"], jobs=2, timeout=600, on_result=print)

Why one fresh process per env rather than a pool of long-lived workers: an env's check may crash its
process (a segfault in a bridged package, `os._exit`) or hang (a game that never ends); a shared worker
would take the other envs down with it, and a pool cannot stop one task. Here a crash or a hang costs
only that env, and becomes one failure row naming it. Processes start from a fork server that has the
checker imported already, so a start costs milliseconds, not the seconds `import datasets` takes.

Results stream: each check's result is sent back as soon as it finishes (`on_result`), and the returned
list is in the order of `names`, then of the checks, whatever the finishing order, so `--jobs 1` and
`--jobs 8` print the same table.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from hubgym.conformance.context import Configs
from hubgym.conformance.runner import CheckResult, iter_checks
from hubgym.errors import EnvContractError, Where

DEFAULT_TIMEOUT = 900.0
"""Seconds one env's checks may take (every config built twice, up to 200 rows per split scored twice)."""

_DONE = "done"  # the last message of a worker that finished normally


def default_jobs(load: float | None = None) -> int:
    """The CPUs this process may run on (a container's or taskset's limit, not the machine's count) that the
    machine's load leaves free, at least one. A check is CPU-bound: on cores other work keeps busy (a test
    suite, a training run) more processes only take turns, and each env's time limit runs out sooner.
    `load`: the CPUs' worth of work to make room for; by default how busy those CPUs were over the last second
    (not the load average, which still counts work that ended up to a few minutes ago)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    busy = _busy_cpus(cpus) if load is None else load
    return max(1, min(len(cpus), len(cpus) - round(busy)))


def _busy_cpus(cpus: list[int], interval_s: float = 1.0) -> float:
    """How many of `cpus` other work kept busy over the next `interval_s` seconds (e.g. 1.5: one and a half)."""
    import psutil

    shares = psutil.cpu_percent(interval=interval_s, percpu=True)
    return sum(shares[cpu] for cpu in cpus if cpu < len(shares)) / 100


@dataclass
class _Running:
    """One env being checked: its process, the pipe its results come through, and when it must be done."""

    name: str
    process: Any
    reader: Connection
    deadline: float
    started: float = field(default_factory=time.perf_counter)
    results: list[CheckResult] = field(default_factory=list)
    done: bool = False  # the worker sent _DONE: every check reported


def check_many(names: list[str], *, jobs: int | None = None, timeout: float = DEFAULT_TIMEOUT,
               configs: Configs = None, max_rows: int = 200, build_rows: int | None = None,
               on_result: Callable[[CheckResult], None] | None = None,
               on_done: Callable[[str], None] | None = None) -> list[CheckResult]:
    """Check every env in `names`, at most `jobs` at a time; never raises for an env's failure, crash or hang.
    `on_result` gets each result as it arrives, `on_done` each env's name when its checks are over."""
    names = list(dict.fromkeys(names))  # an env named twice is checked once
    context = _context()
    jobs = max(1, jobs or default_jobs())
    waiting, running, finished = list(reversed(names)), {}, {}  # reversed: pop() takes them in order
    report, done = on_result or (lambda result: None), on_done or (lambda name: None)
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                name = waiting.pop()
                running[name] = _start(context, name, configs, max_rows, timeout, build_rows)
            next_deadline = min(job.deadline for job in running.values())
            for reader in wait([job.reader for job in running.values()], max(0.0, next_deadline - time.monotonic())):
                job = next(job for job in running.values() if job.reader is reader)
                if _receive(job, report):
                    finished[job.name] = _stop(running.pop(job.name), report)
                    done(job.name)
            for job in [job for job in running.values() if time.monotonic() >= job.deadline]:
                finished[job.name] = _stop(running.pop(job.name), report, timed_out=timeout)
                done(job.name)
    finally:  # Ctrl-C (or a bug here) must not leave checks running behind the prompt
        for job in running.values():
            job.process.kill()
            job.process.join(timeout=10)
    return [result for name in names for result in finished[name]]


def _context() -> Any:
    """A fork server with the checker preloaded where the platform has one (Linux, macOS); else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["hubgym.conformance.parallel"])
        return context
    return multiprocessing.get_context("spawn")


def _start(context: Any, name: str, configs: Configs, max_rows: int, timeout: float,
           build_rows: int | None = None) -> _Running:
    reader, writer = context.Pipe(duplex=False)
    ref = os.path.abspath(name) if _is_path(name) else name  # the fork server's working folder may differ
    process = context.Process(target=_check_in_child, args=(ref, configs, max_rows, writer, build_rows), daemon=True,
                              name=f"hubgym-check-{name}")
    process.start()
    writer.close()  # the child holds the only writing end: its exit is EOF here
    return _Running(name, process, reader, time.monotonic() + timeout)


def _is_path(name: str) -> bool:
    return "/" in name or name.startswith(".") or name.endswith(".py") or os.sep in name


def _check_in_child(name: str, configs: Configs, max_rows: int, writer: Connection,
                    build_rows: int | None = None) -> None:
    """The worker: send each result as its check finishes, then _DONE."""
    _thread_only_progress_lock()
    started = time.perf_counter()
    try:
        for result in iter_checks(name, configs=configs, max_rows=max_rows, build_rows=build_rows):
            writer.send(result)
    except Exception as exc:
        writer.send(CheckResult.failure(name, "load", exc, started))  # unresolvable: a "load" row, as serially
    writer.send(_DONE)
    writer.close()


def _thread_only_progress_lock() -> None:
    """tqdm (datasets' progress bars) creates a multiprocessing lock on first use; a worker killed on timeout
    would leak its semaphore, and Python warns about it at exit. One process per env needs no such lock."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _receive(job: _Running, report: Callable[[CheckResult], None]) -> bool:
    """Take one message; True when the env is over (it sent _DONE, or its process died: EOF)."""
    try:
        message = job.reader.recv()
    except (EOFError, OSError):
        return True
    if message == _DONE:
        job.done = True
        return True
    job.results.append(message)
    report(message)
    return False


def _stop(job: _Running, report: Callable[[CheckResult], None], timed_out: float | None = None) -> list[CheckResult]:
    """End the env's process; a hang or a death without _DONE adds one failure row naming what happened."""
    if timed_out is not None:
        job.process.kill()
    job.process.join(timeout=10)
    job.reader.close()
    if job.done and timed_out is None:
        return job.results
    row = _timeout_row(job, timed_out) if timed_out is not None else _crash_row(job)
    report(row)
    return [*job.results, row]


def _env_of(job: _Running) -> str:
    """The env's own name (ENV) once a check reported it; the name or path it was given before that."""
    return job.results[-1].env if job.results else job.name


def _timeout_row(job: _Running, timeout: float) -> CheckResult:
    last = job.results[-1].check if job.results else None
    error = EnvContractError(
        f"checking stopped after {timeout:g} s: the env's checks did not finish "
        + (f"(the last to finish was {last}; the next one hung)" if last else "(no check finished)"),
        Where(env=_env_of(job)),
        "look for a loop that never ends in generate_tasks or the verifier's step (a game that never reaches done), "
        "or give slow envs more time with --timeout", check="timeout")
    return CheckResult(_env_of(job), "timeout", False, str(error), time.perf_counter() - job.started)


def _crash_row(job: _Running) -> CheckResult:
    code = job.process.exitcode
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    error = EnvContractError(
        f"the process checking this env {how} before its checks finished"
        + (f" (the last to finish was {job.results[-1].check})" if job.results else ""), Where(env=_env_of(job)),
        f"run `hubgym check {job.name}` alone to see the crash; a native crash (segfault) or os._exit in the "
        "builder, the verifier or a package it imports ends the process", check="crash")
    return CheckResult(_env_of(job), "crash", False, str(error), time.perf_counter() - job.started)
