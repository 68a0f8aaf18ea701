"""Build an env's configs, and score samples, in a second Python process with another hash seed: rows or
rewards that follow the iteration order of a set (or anything else that `hash()` of a string decides) differ
between the two processes.

    built = build_elsewhere("arithmetic", ["easy"], out_dir)   # {config: {split: Dataset}}
    scores = score_elsewhere("arithmetic", samples, "1")        # [Score], one per conformance Sample
    python -m hubgym.conformance.rebuild                       # the second process (kept up between requests)

Python draws a new hash seed per process unless PYTHONHASHSEED is set, so two builds in one process always
agree with each other; only a second process can tell. The builder must be importable there: a name, a
folder, or a class reachable as `module:qualname` (`importable_ref`).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hubgym.builders.clock import CHECK_CLOCKS, at_clock

ENTRY = "hubgym.conformance.rebuild"


def hash_seeds() -> tuple[str, str]:
    """(this process's PYTHONHASHSEED, or 'random'; the second process's): always two different seeds."""
    ours = os.environ.get("PYTHONHASHSEED", "random")
    return ours, "2" if ours == "1" else "1"


def importable_ref(ref: object, cls: type) -> str | None:
    """How a second process finds the builder: the ref the user gave when it is a name or a path, the env's name
    when the registry resolves it to this very class, a user file's path, or `module:qualname`; None when the
    class cannot be found by name (made inside a function, or by a test on the fly)."""
    from hubgym.envs import resolve_env

    if isinstance(ref, str):
        return ref
    try:
        if resolve_env(cls.ENV) is cls:
            return cls.ENV
    except Exception:  # not a registered name: try the module
        pass
    module = sys.modules.get(cls.__module__)
    if module is None or getattr(module, cls.__qualname__, None) is not cls or cls.__module__ == "__main__":
        return None
    if cls.__module__.startswith("hubgym_user_") and getattr(module, "__file__", None):
        return module.__file__  # a builder file loaded by path (hubgym.builders.registry.load_builder_file)
    return f"{cls.__module__}:{cls.__qualname__}"


def build_elsewhere(ref: str, configs: list[str], out: Path, hash_seed: str,
                    max_rows: int | None = None) -> dict[str, dict[str, Any]]:
    """Build `configs` of `ref` in a second process with PYTHONHASHSEED=`hash_seed`, under the first check clock;
    {config: {split: Dataset}}. A failure there is a RuntimeError holding its last line. The process stays up for
    the next env (one per hash seed and parent process: checking many envs pays its start once)."""
    import datasets

    out.mkdir(parents=True, exist_ok=True)
    request = {"ref": ref, "configs": configs, "out": str(out.absolute()), "sys_path": sys.path, "max_rows": max_rows,
               "cwd": os.getcwd()}  # a relative folder means what it means here (the process outlives a chdir)
    _worker(hash_seed).build(request)
    return {config: dict(datasets.load_from_disk(str(out / config))) for config in configs}


def score_elsewhere(ref: str, samples: list[Any], hash_seed: str) -> list[Any]:
    """Score `samples` (hubgym.conformance.common.Sample) with `ref`'s verifier in the second process with
    PYTHONHASHSEED=`hash_seed`, under the first check clock; one Score per sample, in order."""
    from hubgym.verifiers.contract import Score

    request = {"op": "score", "ref": ref, "sys_path": sys.path, "cwd": os.getcwd(),
               "samples": [{"task": s.task, "completion": s.completion, "actions": s.actions} for s in samples]}
    reply = _worker(hash_seed).build(request)
    return [Score(r["reward"], r["components"], r["error"]) for r in reply["scores"]]


def _score_here(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The second process's side of `score_elsewhere`."""
    from hubgym.conformance.common import Sample, score_with

    verifier = _load(request["ref"]).verifier()
    with at_clock(CHECK_CLOCKS[0]):
        scores = [score_with(verifier, Sample(None, None, s["task"], "", s["completion"], s["actions"]))
                  for s in request["samples"]]
    return [{"reward": s.reward, "components": s.components, "error": s.error} for s in scores]


REPLY = "HUBGYM-REBUILD-REPLY "
"""How the second process marks its answers on its stdout (where nothing else is written: `serve`)."""


class _Worker:
    """A second Python process that builds envs on request: JSON lines in, marked JSON lines out."""

    def __init__(self, hash_seed: str):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
        self.log = tempfile.TemporaryFile(mode="w+")  # its stderr: read only when it dies
        self.process = subprocess.Popen([sys.executable, "-m", ENTRY], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)

    def alive(self) -> bool:
        return self.process.poll() is None

    def build(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request (a build, or `"op": "score"`); its reply."""
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(REPLY):
                reply = json.loads(line[len(REPLY):])
                if reply["error"]:
                    raise RuntimeError(reply["error"])
                return reply
        self.log.seek(0)
        lines = [line for line in self.log.read().splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"the second process ended (exit code {self.process.wait()})")

    def close(self) -> None:
        if self.alive():
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


_WORKERS: dict[str, _Worker] = {}


def _worker(hash_seed: str) -> _Worker:
    worker = _WORKERS.get(hash_seed)
    if worker is None or not worker.alive():
        worker = _WORKERS[hash_seed] = _Worker(hash_seed)
    return worker


@atexit.register
def _close_workers() -> None:
    for worker in _WORKERS.values():
        worker.close()


def _load(ref: str) -> type:
    """The builder class of a ref that `importable_ref` gave."""
    import importlib

    from hubgym.envs import resolve_env

    module, sep, qualname = ref.partition(":")
    if sep and "/" not in ref and not Path(ref).exists():
        return getattr(importlib.import_module(module), qualname)
    return resolve_env(ref)


def serve() -> None:
    """The second process: for each request line, build each config and save it where the first process reads
    it (or, for `"op": "score"`, score the samples), then answer one marked line (the error's last line, or none).

    The answers go out on a private copy of stdout; stdout itself is pointed at stderr, so whatever a builder
    prints (reasoning-gym's bf compiler prints dots with no newline) can never run into an answer's line."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    for line in sys.stdin:
        request, answer = json.loads(line), {}
        try:
            os.chdir(request["cwd"])
            sys.path[:] = request["sys_path"]  # the first process's, so a test module's class imports here too
            if request.get("op") == "score":
                answer = {"scores": _score_here(request)}
            else:
                _build_here(request)
            error = None
        except Exception as exc:  # noqa: BLE001 - reported to the first process, which names the env and the fix
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        print(REPLY + json.dumps({"error": error, **answer}), file=answers, flush=True)


def _build_here(request: dict[str, Any]) -> None:
    """The second process's side of `build_elsewhere`."""
    from hubgym.envs.build import build_tasks

    cls, out = _load(request["ref"]), Path(request["out"])
    with at_clock(CHECK_CLOCKS[0]):
        for config in request["configs"]:
            built = build_tasks(cls, config, cache_dir=out / f".cache-{config}", max_rows=request["max_rows"])
            built.save_to_disk(str(out / config))


if __name__ == "__main__":
    serve()
