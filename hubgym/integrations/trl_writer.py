"""Where a recorded TRL run's rows are audited and written: a child process at the lowest CPU priority.

The training process builds each batch's rows (it holds the verifier and TRL's outputs; a few milliseconds) and
hands them over; everything else a stored row costs, the token audit against the chat template, Arrow encoding,
the contract checks, the fsyncs and the manifest, runs here. In its own process it holds no lock the trainer
needs (a writer thread would hold the GIL that TRL's generation loop asks for every token), and at `nice` 19 it
runs on the cycles the step leaves idle: on a busy machine the step keeps its cores and the rows wait.

    python -m hubgym.integrations.trl_writer      # started by WriterProcess, never by hand

The pipe carries pickles between the two halves of one recorder (never stored data): a `WriterSetup`, then
`(rows, last_step)` per batch; end of input means training ended (or the trainer died: what arrived is written
all the same). The child answers `("ready",)` or `("error", text)` once it holds the run folder, and
`("done", stats)` when everything is on disk.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hubgym.errors import HubgymError, IntegrationError

NICE = 19  # the writer's CPU priority once set up: it waits for idle cycles (its queue is on the trainer's side)


@dataclass
class WriterSetup:
    """What the writing side needs: where, as which worker of which run, and how to audit and describe the rows."""

    out: Path
    worker: str
    run_id: str
    renderer: Any  # a ChatRenderer for the token audit, or None (not audited)
    tool_schemas: list[dict] | None
    manifest: dict[str, Any]  # the run's manifest fields; the sink adds the worker's shards, rows and policy version


class RowSink:
    """Audits and writes rows into one worker's part of a run folder (its lock held until `close`)."""

    def __init__(self, setup: WriterSetup):
        from hubgym.rollout.writer import ShardWriter

        self.setup = setup
        self.writer = ShardWriter(setup.out, setup.worker, run_id=setup.run_id)
        self.stored = self.writer.existing_ids()  # a re-run does not store a row twice
        self.last_step, self.batches = 0, 0
        self.seconds = 0.0  # CPU seconds auditing and writing (at nice 19 the wall time is mostly waiting for a turn)

    def put(self, rows: list[dict[str, Any]], last_step: int) -> None:
        """Audit the rows, buffer them by group, and write what is due (the writer's size and age limits)."""
        from hubgym.rollout.tokens import audit_tokens

        started = time.thread_time()
        rows = [r for r in rows if r["rollout_id"] not in self.stored]
        if self.setup.renderer is not None:  # the audit every written row gets (hubgym replay's)
            for row in rows:
                row["tokens_consistent"] = audit_tokens(row, self.setup.renderer, self.setup.tool_schemas).ok
        groups: dict[str, list] = {}
        for row in rows:
            groups.setdefault(row["group"], []).append(row)
        for group in groups.values():
            self.writer.add_group(group, flush=False)
        self.stored.update(r["rollout_id"] for r in rows)
        self.last_step, self.batches = last_step, self.batches + 1
        if self.writer.flush_due() is not None:
            self.write_manifest()
        self.seconds += time.thread_time() - started

    def write_manifest(self) -> None:
        import datetime as dt

        self.writer.write_manifest({
            **self.setup.manifest, "worker": self.writer.worker, "policy_version": self.last_step,
            "rows": self.writer.rows_written, "shards": [p.name for p in self.writer.shards()],
            "shard_files": self.writer.shard_files(), "updated_at": dt.datetime.now(dt.timezone.utc).isoformat()})

    def close(self, *, write: bool = True) -> dict[str, Any]:
        """Write what is buffered and the manifest (unless `write` is False: after a failure), give the folder back;
        the sink's counts."""
        started = time.thread_time()
        try:
            if write:
                self.writer.flush()
                self.write_manifest()
        finally:
            self.writer.close()
            self.seconds += time.thread_time() - started
        return self.stats()

    def stats(self) -> dict[str, Any]:
        """Rows in this worker's shards, batches received, CPU seconds spent auditing and writing."""
        return {"rows": self.writer.rows_written, "batches": self.batches, "write_s": self.seconds}


# -- the child process ----------------------------------------------------------------------------------------------


def main() -> None:
    """The child: set up (at the trainer's priority: `attach` waits for it), then, at the lowest priority, store
    every batch that arrives until the input ends."""
    answers = os.fdopen(os.dup(1), "wb")  # the answer channel; stray prints of libraries go to stderr instead
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    try:
        sink = RowSink(pickle.load(requests))
    except HubgymError as exc:  # a folder of another run, or held by another writer: raised as it is
        return _answer(answers, ("error", exc))
    except Exception as exc:
        return _answer(answers, ("error", f"{type(exc).__name__}: {exc}"))
    _answer(answers, ("ready",))
    os.nice(NICE)
    error = None
    while True:
        try:
            rows, last_step = pickle.load(requests)
        except (EOFError, pickle.UnpicklingError):  # the end, or a trainer killed mid-send: that batch never arrived
            break
        if error is None:
            try:
                sink.put(rows, last_step)
            except Exception as exc:  # kept and answered at the end: the rows stored before it are kept
                error = f"{type(exc).__name__}: {exc}"
    try:
        sink.close(write=error is None)
    except Exception as exc:
        error = error or f"{type(exc).__name__}: {exc}"
    _answer(answers, ("done", {**sink.stats(), "error": error}))
    os._exit(0)  # everything is on disk and the folder given back: no interpreter teardown at the lowest priority


def _answer(channel: BinaryIO, message: tuple) -> None:
    pickle.dump(message, channel)
    channel.flush()


# -- the trainer's side ---------------------------------------------------------------------------------------------


class WriterProcess:
    """The trainer's handle on the child: `put` queues a batch (a thread feeds the pipe, so a step never waits for
    the child), `close` ends the input and waits until everything is written."""

    def __init__(self, setup: WriterSetup):
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self._stderr, env=_child_env())
        self._input = _ForkGuard(self.process.stdin.fileno())
        try:
            self._send(setup)
            answer = self._receive()
        except (BrokenPipeError, EOFError, pickle.UnpicklingError):
            answer = ("error", f"the writer process ended with code {self.process.wait()} {self._stderr_tail()}")
        if answer[0] != "ready":
            self.process.wait()
            if isinstance(answer[1], Exception):
                raise answer[1]
            raise IntegrationError(f"cannot record into {setup.out}: {answer[1]}".strip(), framework="trl",
                                   setting="out")
        self._queue: queue.Queue = queue.Queue()
        self._failed: str | None = None
        self._feeder = threading.Thread(target=self._feed, name="hubgym-trl-recorder", daemon=True)
        self._feeder.start()

    def put(self, rows: list[dict[str, Any]], last_step: int) -> None:
        self._queue.put((rows, last_step))

    def wait_handed(self) -> None:
        """Block until every batch put so far is in the pipe (written or not): a trainer killed after this loses
        none of them, since the child writes what arrived when its input ends."""
        self._queue.join()

    def close(self) -> dict[str, Any]:
        """End the input, wait for the child to write everything; its counts and error (None if all went well)."""
        self._queue.put(None)
        self._feeder.join()
        self._input.fd = None
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            answer = self._receive()
        except (EOFError, pickle.UnpicklingError):
            answer = None
        code = self.process.wait()
        if answer is None or answer[0] != "done":
            return {"rows": None, "batches": None, "write_s": 0.0,
                    "error": f"the writer process ended with code {code} {self._stderr_tail()}".strip()}
        return answer[1] if self._failed is None else {**answer[1], "error": answer[1]["error"] or self._failed}

    def _feed(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._failed is None:
                    self._send(item)
            except (BrokenPipeError, OSError) as exc:  # the child died: close() says how
                self._failed = f"{type(exc).__name__}: {exc}"
            finally:
                self._queue.task_done()

    def _send(self, item: Any) -> None:
        pickle.dump(item, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.flush()

    def _receive(self) -> tuple:
        return pickle.load(self.process.stdout)

    def _stderr_tail(self) -> str:
        """The child's last line on stderr (what a crash printed last)."""
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""


class _ForkGuard:
    """A process forked from the trainer (a DataLoader worker, say) inherits the writer's input, and while it holds
    it open the writer never sees its input end: in every fork, the open input is pointed at /dev/null."""

    def __init__(self, fd: int):
        self.fd: int | None = fd  # None once closed (the number may then be another file's)
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        if self.fd is not None:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.fd)
            os.close(null)


def _child_env() -> dict[str, str]:
    """The trainer's environment, with hubgym importable as the trainer imported it (a checkout, not installed)."""
    import hubgym

    env = dict(os.environ)
    root = str(Path(hubgym.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")  # the child's tokenizer stays on the one thread it has
    env["OMP_NUM_THREADS"] = "1"
    return env


if __name__ == "__main__":
    main()
