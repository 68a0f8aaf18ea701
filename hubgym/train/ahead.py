"""The vLLM engine's work on one background thread, so online rollouts can be sampled ahead of training.

    worker = EngineWorker()
    worker.submit(sync, state, version)        # weight syncs and rollouts run in the order submitted
    worker.plan(step, produce)                 # step's rollouts start as soon as the thread is free
    rows, timings = worker.rows(step)          # waits for them
    worker.drain()                             # before anything else touches the engine (eval, checkpoint)

With `online.async_steps = k` the trainer plans the rollouts of step t while steps t-k..t-1 still train, so
sampling (vLLM, in its own process) and the optimizer step overlap; the rows of step t are then sampled by
the weights of step t-k, and the loss corrects for the lag with its importance weight against the stored
behaviour logprobs (`policy_version` records it). k = 0 is strictly on-policy: each step's rollouts are
planned just before they are needed.

Why one thread and a queue rather than a second engine or locks: a weight sync must never land in the
middle of a rollout, and the weights that sample a given step must depend on the config only, never on
timing, so that a resumed run samples exactly what the killed one would have. A FIFO of engine jobs gives
both: a rollout runs with the weights of the last sync submitted before it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable


class EngineWorker:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hubgym-engine")
        self._jobs: list[Future] = []
        self._rows: dict[int, Future] = {}
        self.planned_until = -1  # the last step whose rollouts were planned
        self.sync_seconds = 0.0  # spent in weight syncs since the last `rows`
        self._sync_lock = threading.Lock()  # added to on the engine thread, read and reset on the caller's
        # Set by `close`, or by a Ctrl-C (hubgym.rollout.interrupt.noting_ctrl_c): a running job that watches it
        # ends early, and a wait for rows or for the queue raises KeyboardInterrupt.
        self.stopping = threading.Event()

    def submit(self, job: Callable[..., Any], *args: Any) -> Future:
        """Run `job(*args)` on the engine thread after everything submitted before it."""
        future = self._pool.submit(job, *args)
        self._jobs.append(future)
        return future

    def sync(self, job: Callable[..., float], *args: Any) -> None:
        """A weight sync: `job` returns its seconds, reported with the next step's rollouts."""
        def timed() -> None:
            seconds = job(*args)
            with self._sync_lock:
                self.sync_seconds += seconds

        self.submit(timed)

    def plan(self, step: int, produce: Callable[[int], list[dict]]) -> None:
        """Start sampling `step`'s rollouts once the engine thread is free."""
        def timed() -> tuple[list[dict], float]:
            started = time.perf_counter()
            return produce(step), time.perf_counter() - started

        self._rows[step] = self.submit(timed)
        self.planned_until = max(self.planned_until, step)

    def rows(self, step: int) -> tuple[list[dict], dict[str, float]]:
        """`step`'s rollouts (waiting for them) and the timings: generation, the wait, and syncs since last time."""
        started = time.perf_counter()
        with self._stopped_reads_as_interrupt():
            rows, generate_s = result(self._rows.pop(step), self.stopping)  # a failure in the thread is raised here
            self._raise_failures()  # e.g. a weight sync that failed before these rows were sampled
        with self._sync_lock:
            synced, self.sync_seconds = self.sync_seconds, 0.0
        timings = {"time/generate_s": generate_s, "time/wait_s": time.perf_counter() - started, "time/sync_s": synced}
        return rows, timings

    def drain(self) -> None:
        """Wait for every job submitted so far (raising the first failure)."""
        jobs, self._jobs = self._jobs, []
        with self._stopped_reads_as_interrupt():
            for job in jobs:
                result(job, self.stopping)

    @contextlib.contextmanager
    def _stopped_reads_as_interrupt(self) -> Iterator[None]:
        """Once the run is stopping, a job's failure is its consequence (vLLM died with the Ctrl-C; a cancelled
        rollout): the caller sees the interrupt, not an engine error."""
        try:
            yield
        except Exception as exc:
            if self.stopping.is_set():
                raise KeyboardInterrupt("the run is stopping") from exc
            raise

    def _raise_failures(self) -> None:
        finished = [job for job in self._jobs if job.done()]
        self._jobs = [job for job in self._jobs if not job.done()]
        for job in finished:
            job.result()

    def close(self) -> None:
        """Stop: queued jobs are dropped; a running one is told to stop (`stopping`) and waited for."""
        self.stopping.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


def result(future: Future, stopping: threading.Event | None = None, poll_s: float = 0.2) -> Any:
    """`future.result()`, waking every `poll_s`: Python runs a Ctrl-C's handler only when the main thread runs,
    and a signal that lands on one of vLLM's or torch's threads does not wake a main thread blocked on a lock.
    Once `stopping` is set the wait ends with KeyboardInterrupt (a Ctrl-C whose own exception was swallowed)."""
    while not wait([future], timeout=poll_s).done:
        if stopping is not None and stopping.is_set():
            raise KeyboardInterrupt("the run is stopping")
    return future.result()
