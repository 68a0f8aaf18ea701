"""Ctrl-C during a rollout run: stop at the next await, and tell an interrupt from an engine failure.

    interrupted = run_until_done_or_ctrl_c(generate_everything())

A terminal's Ctrl-C sends SIGINT to the whole process group, so vLLM's engine-core and worker processes
get it too and die. Requests still in flight then fail with `EngineError`, sometimes before the
cancellation that the signal started has reached every coroutine, and asyncio would report the run as an
engine failure. Here the signal is noted when it arrives, so a run whose engine fails after it reads as
the interrupt it is. Like `asyncio.run`'s own handler, the signal cancels the work at its next `await`
(a group is stored whole or not at all), and a second Ctrl-C stops at once.

Where the calling thread already runs an event loop (a notebook cell, an async web app), `asyncio.run` refuses to
start another: the work then runs on a loop of its own in a helper thread while the caller's thread waits, and a
Ctrl-C there (a notebook's interrupt) cancels it the same way (`run_on_own_loop`).

The trainer, whose vLLM work runs on a thread of its own, notes a Ctrl-C in an event instead:

    with noting_ctrl_c(worker.stopping):
        train()          # waits on the engine thread raise KeyboardInterrupt once the event is set
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from hubgym.errors import EngineError

GRACE_S = 1.0  # an engine error with no Ctrl-C seen yet waits this long for one (the signal may still be on its way)
T = TypeVar("T")


def run_until_done_or_ctrl_c(work: Coroutine[Any, Any, None]) -> bool:
    """Run `work` to its end; True if Ctrl-C stopped it (at an await: what it finished is whole), False if it
    finished. Works whether or not this thread already runs an event loop."""
    if not loop_running():
        return asyncio.run(until_done_or_ctrl_c(work))
    try:
        run_on_own_loop(work)
    except KeyboardInterrupt:
        return True
    return False


def run_coroutine(work: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(work)`, also from a thread that already runs an event loop."""
    return run_on_own_loop(work) if loop_running() else asyncio.run(work)


def loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _join(thread: threading.Thread) -> None:
    """Wait for `thread` in short slices: Python runs a signal's handler (Ctrl-C's KeyboardInterrupt) between
    them, wherever the kernel delivered the signal (an endless join only wakes for one sent to this thread)."""
    while thread.is_alive():
        thread.join(0.1)


def run_on_own_loop(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` on a new event loop in a helper thread and wait for its result here. A KeyboardInterrupt while
    waiting (Ctrl-C, a notebook's interrupt) cancels `work` at its next await, waits until it has wound down (so
    nothing it started still writes when the caller cleans up), then raises KeyboardInterrupt whatever `work`
    ended with: its engine may have died of the same signal. A second one while winding down leaves at once."""
    started = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> T:
        state["loop"], state["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await work

    def target() -> None:
        try:
            state["result"] = asyncio.run(main())
        except BaseException as error:  # handed to the waiting thread, which raises it there
            state["error"] = error
        finally:
            started.set()  # also when main never ran

    thread = threading.Thread(target=target, name="hubgym-event-loop", daemon=True)
    thread.start()
    try:
        _join(thread)
    except KeyboardInterrupt:
        started.wait()
        if "task" in state:
            state["loop"].call_soon_threadsafe(state["task"].cancel)
        _join(thread)
        raise
    if "error" in state:
        raise state["error"]
    return state["result"]


async def until_done_or_ctrl_c(work: Coroutine[Any, Any, None]) -> bool:
    """Run `work`; True if Ctrl-C stopped it, False if it finished. Outside the main thread (no signal
    handlers there) it just runs `work`."""
    if threading.current_thread() is not threading.main_thread():
        await work
        return False
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    ctrl_c = asyncio.Event()

    def on_ctrl_c() -> None:
        if ctrl_c.is_set():
            raise KeyboardInterrupt  # the second one: leave now
        ctrl_c.set()
        task.cancel()

    previous = signal.getsignal(signal.SIGINT)  # put back afterwards (asyncio would put Python's default)
    loop.add_signal_handler(signal.SIGINT, on_ctrl_c)
    try:
        await task
        return False
    except asyncio.CancelledError:
        if ctrl_c.is_set():
            return True
        raise
    except EngineError:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctrl_c.wait(), GRACE_S)
        if ctrl_c.is_set():
            return True
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def noting_ctrl_c(noted: threading.Event) -> Iterator[None]:
    """While inside (on the main thread): a Ctrl-C sets `noted`, then raises KeyboardInterrupt as usual.

    Python raises a Ctrl-C's KeyboardInterrupt in whatever code the main thread runs at that moment, and some
    code swallows it: a finalizer (`__del__`, a weakref callback) run by the garbage collector, a library's
    `except BaseException`. The run would then go on as if nothing happened, and restart the vLLM engine that
    the same Ctrl-C killed. The event outlives the exception: code that waits or restarts looks at it too.
    Outside the main thread (no signal handlers there) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_ctrl_c(signum: int, frame: Any) -> None:
        noted.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
