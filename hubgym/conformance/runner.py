"""Run the conformance checks on one environment: `check_env`, `assert_env_ok`, `iter_checks`.

Each check (hubgym.conformance.checks.CHECKS, in order) is a function of one shared Context
(hubgym.conformance.context), which makes what the checks inspect once, on first use. A check that fails
raises EnvContractError; one that cannot run because something it needs failed earlier raises CheckSkipped
and is reported as skipped. So the first failure of a run is always the root cause, and `assert_env_ok`
raises that one.

    for result in iter_checks("arithmetic"):
        print(result.check, result.status, result.message)
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from hubgym.builders.base import TaskBuilder
from hubgym.conformance.checks import CHECKS
from hubgym.conformance.common import CheckSkipped
from hubgym.conformance.context import Configs, Context
from hubgym.envs.refs import parse_ref
from hubgym.errors import EnvContractError, HubgymError, Where, error_text


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: passed (ok), failed, or skipped (it could not run; `message` says why)."""

    env: str  # env name
    check: str  # e.g. "check_ids_stable"
    ok: bool
    message: str  # "" when ok; else the full error message (what [where]. Fix: how)
    seconds: float
    skipped: bool = False  # not run: something it needs failed in an earlier check, or cannot be had here

    @property
    def failed(self) -> bool:
        return not self.ok and not self.skipped

    @classmethod
    def failure(cls, env: str, check: str, exc: BaseException, started: float) -> CheckResult:
        """A failure row for an error raised outside the checks themselves (loading or building an env)."""
        return cls(env, check, False, error_text(exc), time.perf_counter() - started)

    @property
    def status(self) -> str:
        return "ok" if self.ok else "skipped" if self.skipped else "failed"


# -- running ---------------------------------------------------------------------------------

def iter_outcomes(env: str | type[TaskBuilder], *, configs: Configs = None, max_rows: int = 200,
                  build_rows: int | None = None,
                  checks: list[Callable[[Context], None]] | None = None
                  ) -> Iterator[tuple[CheckResult, EnvContractError | None]]:
    """Run the checks in order, yielding each result with the error it raised (None when ok)."""
    env, configs = _config_of_ref(env, configs)
    with tempfile.TemporaryDirectory(prefix="hubgym-check-") as tmp:
        ctx = Context(env, configs, max_rows, Path(tmp), build_rows)
        for check in checks or CHECKS:
            ctx.check = check.__name__
            start = time.perf_counter()
            with _quiet_datasets():  # per check: the caller runs other code between results
                error = _run_one(check, ctx)
            yield CheckResult(ctx.env, check.__name__, error is None, str(error) if error else "",
                              time.perf_counter() - start, isinstance(error, CheckSkipped)), error


def _config_of_ref(env: str | type[TaskBuilder], configs: Configs) -> tuple[str | type[TaskBuilder], Configs]:
    """`ENV:CONFIG` checks that config, as `configs=[CONFIG]` does (the ref itself, as every other command reads
    it); the env is then found without it. Both, naming other configs, are refused."""
    if not isinstance(env, str):
        return env, configs
    try:
        ref = parse_ref(env)
    except HubgymError:  # not a reference at all: the checks report it (check_declaration)
        return env, configs
    if ref.config is None:  # the env as the second process of the hash-seed check can find it ("arithmetic:" too)
        return ref.text, configs
    if configs is not None and configs != [ref.config]:
        raise EnvContractError(f"{env!r} names config {ref.config!r}, but configs asks for {configs!r}",
                               Where(env=ref.name or ref.text, config=ref.config),
                               "name the configs once: ENV:CONFIG, or ENV with configs")
    return ref.text, [ref.config]


def _run_one(check: Callable[[Context], None], ctx: Context) -> EnvContractError | None:
    name = check.__name__
    try:
        check(ctx)
    except EnvContractError as exc:
        if exc.check == name:
            return exc
        try:  # errors raised by shared helpers (validate_tasks, load_verifier...) gain the check's name
            tagged = type(exc)(exc.what, exc.where, exc.fix, check=name)
        except TypeError:  # a subclass with its own constructor
            tagged = EnvContractError(exc.what, exc.where, exc.fix, check=name)
        tagged.__cause__ = exc.__cause__
        return tagged
    except Exception as exc:  # a bug in the check, or an env value it did not foresee: still one failed check
        crashed = EnvContractError(f"the check itself crashed with {type(exc).__name__}: {exc}", ctx.where(),
                                   "this is likely a checker bug; report it with the env and this message", check=name)
        crashed.__cause__ = exc
        return crashed
    return None


def iter_checks(env: str | type[TaskBuilder], *, configs: Configs = None, max_rows: int = 200,
                build_rows: int | None = None) -> Iterator[CheckResult]:
    """Like check_env, but yields each result as soon as its check finishes (for progress display)."""
    for result, _ in iter_outcomes(env, configs=configs, max_rows=max_rows, build_rows=build_rows):
        yield result


def check_env(env: str | type[TaskBuilder], *, configs: Configs = None, max_rows: int = 200,
              build_rows: int | None = None, checks: list[Callable[[Context], None]] | None = None
              ) -> list[CheckResult]:
    """Run every check on one env (resolved with hubgym.envs.resolve_env).

    Never raises for a check failure: each failure is a CheckResult with ok=False and the message.
    `configs` limits the configs built (default: all; Only.DEFAULT: the one built when none is named);
    `max_rows` caps the rows scored per split; `build_rows` caps the rows each split is built with (default:
    every row its config declares); `checks` runs these checks of CHECKS only, in CHECKS' order (default: all).
    """
    chosen = None if checks is None else [c for c in CHECKS if c in checks]
    return [result for result, _ in iter_outcomes(env, configs=configs, max_rows=max_rows, build_rows=build_rows,
                                                  checks=chosen)]


def assert_env_ok(env: str | type[TaskBuilder], **kwargs: Any) -> None:
    """Raise the first failing check's EnvContractError (its message names the check); stop there."""
    with contextlib.closing(iter_outcomes(env, **kwargs)) as outcomes:  # closing removes the build folders now
        for _, error in outcomes:
            if error is not None and not isinstance(error, CheckSkipped):
                raise error


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Building prints one progress bar per split; the checker reports its own progress."""
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
