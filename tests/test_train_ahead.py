"""EngineWorker: engine jobs run one at a time in the order submitted, and no failure is lost."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest

from hubgym.errors import EngineError, RolloutsStopped, WeightSyncError
from hubgym.rollout.interrupt import noting_ctrl_c
from hubgym.train.ahead import EngineWorker


@pytest.fixture
def worker():
    worker = EngineWorker()
    yield worker
    worker.close()


def test_rollouts_are_sampled_with_the_weights_synced_last_before_them(worker):
    served, log = {"version": 0}, []
    gate = threading.Event()

    def sync(version: int) -> float:
        gate.wait(5)  # held until both rollouts below are queued: order, not timing, decides
        served["version"] = version
        log.append(f"sync{version}")
        return 0.25

    def produce(step: int) -> list[dict]:
        log.append(f"rollout{step}")
        return [{"step": step, "version": served["version"]}]

    worker.plan(0, produce)
    worker.sync(sync, 1)
    worker.plan(1, produce)
    gate.set()

    rows0, timings0 = worker.rows(0)
    rows1, timings1 = worker.rows(1)
    assert (rows0, rows1) == ([{"step": 0, "version": 0}], [{"step": 1, "version": 1}])
    assert log == ["rollout0", "sync1", "rollout1"]
    assert worker.planned_until == 1
    assert timings1["time/sync_s"] == 0.25 and timings0["time/generate_s"] >= 0 and timings1["time/wait_s"] >= 0


def test_a_failed_sync_is_raised_with_the_next_rows(worker):
    def failing_sync() -> float:
        raise WeightSyncError("weights do not fit the model")

    worker.sync(failing_sync)
    worker.plan(0, lambda step: [{"step": step}])
    with pytest.raises(WeightSyncError, match="do not fit"):
        worker.rows(0)


def test_drain_waits_for_every_job_and_raises_a_failure(worker):
    done = []
    worker.submit(lambda: done.append("a"))
    worker.submit(lambda: done.append("b"))
    worker.drain()
    assert done == ["a", "b"]

    worker.plan(3, lambda step: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        worker.drain()


def test_a_signal_landing_on_another_thread_still_interrupts_the_wait_for_rows(worker):
    """Ctrl-C may be delivered to any thread (vLLM's, torch's, the engine thread); Python runs its handler in the
    main thread only when that thread runs, so a main thread blocked until a long rollout ends would not see it."""
    release, finished = threading.Event(), threading.Event()

    def produce(step: int) -> list[dict]:
        deadline = time.monotonic() + 30
        while not main_thread_waits_for_rows() and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # lands on this (the engine) thread
        release.wait(30)
        finished.set()
        return []

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)  # SIGUSR1 stands in for SIGINT (test runners own that one)
    try:
        worker.plan(0, produce)
        with pytest.raises(KeyboardInterrupt):
            worker.rows(0)
        assert not finished.is_set()  # raised while the rollout was still running
    finally:
        release.set()
        signal.signal(signal.SIGUSR1, previous)


def main_thread_waits_for_rows() -> bool:
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if frame.f_code.co_name == "rows" and frame.f_code.co_filename.endswith("ahead.py"):
            return True
        frame = frame.f_back
    return False


def test_close_tells_a_running_job_to_stop(worker):
    seen = []

    def produce(step: int) -> list[dict]:
        seen.append(worker.stopping.wait(30))
        return []

    worker.plan(0, produce)
    worker.close()
    assert seen == [True]


def test_a_ctrl_c_whose_exception_is_swallowed_still_stops_the_wait_for_rows(worker):
    """A Ctrl-C's KeyboardInterrupt is raised in whatever the main thread runs; a finalizer or a library's
    `except BaseException` may swallow it. The noted event still ends the wait, with the rollout still running."""
    release = threading.Event()

    def produce(step: int) -> list[dict]:
        release.wait(30)
        return []

    def finalizer_that_swallows_everything() -> None:
        try:
            signal.raise_signal(signal.SIGINT)
        except BaseException:
            pass

    before = signal.getsignal(signal.SIGINT)
    try:
        with noting_ctrl_c(worker.stopping):
            worker.plan(0, produce)
            finalizer_that_swallows_everything()
            with pytest.raises(KeyboardInterrupt):
                worker.rows(0)
        assert not release.is_set()
    finally:
        release.set()
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


def test_once_stopping_a_failed_job_reads_as_the_interrupt(worker):
    def sync_into_a_dead_engine() -> float:
        raise EngineError("the vLLM engine is not running (its engine-core process died)")

    worker.sync(sync_into_a_dead_engine)
    worker.plan(0, lambda step: [])
    worker.stopping.set()
    with pytest.raises(KeyboardInterrupt) as raised:
        worker.rows(0)
    assert isinstance(raised.value.__cause__, EngineError)


class DeadEngine:
    """Stands in for a vLLM engine whose processes a Ctrl-C killed (only `alive` is asked)."""

    def alive(self) -> bool:
        return False


def test_the_trainer_does_not_restart_an_engine_that_died_with_a_ctrl_c():
    from hubgym.train.config import TINY_CONFIG, load_config
    from hubgym.train.trainer import Trainer

    trainer = Trainer(load_config(TINY_CONFIG, []), engine=DeadEngine())
    trainer.worker.stopping.set()
    with pytest.raises(RolloutsStopped, match="not restarted"):
        trainer._revive()
    trainer.close()
