"""pytest plugin: run hubgym's conformance checks on your environment, from your own repo.

It is registered as the `pytest11` entry point `hubgym`, so it is active wherever hubgym is
installed. Nothing heavy is imported until a check runs.

One test per check, named `hubgym-check[<env>::<check>]` (select them with `-k`):

    pytest --hubgym-env ./my_env                      # a folder holding builder.py, verifier.py, golden.jsonl
    pytest --hubgym-env ./envs                        # a folder of env folders: each one holding builder.py
    pytest --hubgym-env ./my_env --hubgym-config easy --hubgym-max-rows 50

Or a fixture, in your own `test_env.py`:

    def test_my_env(hubgym_check):
        hubgym_check("./my_env")    # fails listing every failing check's message; returns the CheckResults

A failing check's report is its message (what, where, likely cause, fix), without a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pytest

if TYPE_CHECKING:
    from hubgym.conformance.runner import CheckResult

_RUNS = pytest.StashKey[list["_EnvRun"]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hubgym", "hubgym environment conformance")
    group.addoption("--hubgym-env", action="append", default=[], metavar="ENV",
                    help="run hubgym's conformance checks on ENV (a folder with builder.py, a folder of such folders, "
                         "a builder .py file, or a registered env name), one test per check; may be repeated")
    group.addoption("--hubgym-config", action="append", default=[], metavar="NAME",
                    help="check only this builder config (may be repeated; default: every config)")
    group.addoption("--hubgym-max-rows", type=int, default=200, metavar="N",
                    help="rows scored per split by the scoring checks (default: 200)")


def env_label(ref: str) -> str:
    """How test ids name an env: the folder name for a path, the name itself otherwise."""
    path = Path(ref)
    if path.name == "builder.py":
        return path.resolve().parent.name
    return path.stem if path.suffix == ".py" else (path.name or ref)


class _EnvRun:
    """One env's checks, run in order as its items ask for them: they share one context (one build per config)."""

    def __init__(self, ref: str, configs: list[str], max_rows: int):
        self.ref, self.configs, self.max_rows = ref, configs or None, max_rows
        self._results: dict[str, CheckResult] = {}
        self._pending: Iterator[CheckResult] | None = None

    def result(self, check: str) -> CheckResult:
        if self._pending is None:
            from hubgym.conformance.runner import iter_checks

            self._pending = iter_checks(self.ref, configs=self.configs, max_rows=self.max_rows)
        while check not in self._results:  # items deselected with -k still run: later checks may need them
            result = next(self._pending)
            self._results[result.check] = result
        return self._results[check]

    def close(self) -> None:
        if self._pending is not None:
            self._pending.close()  # removes the run's temporary build folders


class HubgymCheckFailed(Exception):
    """A conformance check failed; the message is the check's full message."""


class HubgymCheckItem(pytest.Item):
    """One conformance check of one env."""

    def __init__(self, *, run: _EnvRun, check: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.run, self.check = run, check

    def runtest(self) -> None:
        result = self.run.result(self.check)
        if result.skipped:
            pytest.skip(result.message)
        if not result.ok:
            raise HubgymCheckFailed(result.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, HubgymCheckFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return self.run.ref, None, self.name


@pytest.hookimpl(tryfirst=True)  # before -k / --deselect filter the items
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    refs = config.getoption("hubgym_env")
    if not refs:
        return
    from hubgym.conformance.checks import CHECKS

    runs = config.stash.setdefault(_RUNS, [])
    for ref, label in [env for ref in refs for env in _envs_named(ref)]:
        run = _EnvRun(ref, config.getoption("hubgym_config"), config.getoption("hubgym_max_rows"))
        runs.append(run)
        names = [f"hubgym-check[{label}::{check.__name__}]" for check in CHECKS]
        new = [HubgymCheckItem.from_parent(session, name=name, nodeid=name, run=run, check=check.__name__)
               for name, check in zip(names, CHECKS)]
        # report them as collected, so "collected N items" and -k's "M selected" count them
        session.ihook.pytest_collectreport(report=pytest.CollectReport(f"hubgym-check[{label}]", "passed",
                                                                       None, new))
        items.extend(new)


def _envs_named(ref: str) -> list[tuple[str, str]]:
    """(ref, test-id label) of each env `ref` names: one env, or every env folder below a folder of envs."""
    if not Path(ref).is_dir() or (Path(ref) / "builder.py").is_file():
        return [(ref, env_label(ref))]
    from hubgym.conformance.discover import env_folders

    found = env_folders(ref)
    if not found:
        raise pytest.UsageError(f"--hubgym-env {ref}: no folder at or below it holds builder.py; give an env folder, "
                                f"a folder of env folders, or an env name")
    return found


def pytest_sessionfinish(session: pytest.Session) -> None:
    for run in session.config.stash.get(_RUNS, []):
        run.close()


@pytest.fixture
def hubgym_check() -> Callable[..., list[CheckResult]]:
    """`hubgym_check(env, configs=None, max_rows=200)`: run every check; fail the test listing each failure."""
    from hubgym.conformance.runner import check_env

    def run(env: str | os.PathLike[str] | type, *, configs: list[str] | None = None,
            max_rows: int = 200) -> list[CheckResult]:
        ref = os.fspath(env) if isinstance(env, os.PathLike) else env
        results = check_env(ref, configs=configs, max_rows=max_rows)
        failed = [r for r in results if r.failed]
        if failed:
            lines = "\n".join(f"- {r.message}" for r in failed)
            pytest.fail(f"{len(failed)} of {len(results)} hubgym checks failed for {results[0].env!r}:\n{lines}",
                        pytrace=False)
        return results

    return run
