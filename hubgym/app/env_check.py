"""One env's step of the main job (`hubgym demo`, hubgym.app.pipeline): build its first config into Parquet
files, read them back, and run the conformance checks on that config, giving one summary line per env.

    summary, results = demo_env("arithmetic", Path("out/demo/envs"), max_rows=20)
"""

from __future__ import annotations

import time
from pathlib import Path

from hubgym.builders.base import TaskBuilder
from hubgym.envs.build import build_files
from hubgym.envs import resolve_env
from hubgym.envs.catalog import count_rows
from hubgym.conformance.runner import CheckResult
from hubgym.app.views import EnvSummary



def demo_env(name: str, out: Path, max_rows: int) -> tuple[EnvSummary, list[CheckResult]]:
    """Build `name` (first config) under `out/name`, then check that config. Errors become failed checks."""
    from hubgym.conformance import check_env

    started = time.perf_counter()
    try:
        builder = resolve_env(name)
    except Exception as exc:  # an env that does not load is one failed check, not the end of the demo
        failure = CheckResult.failure(name, "load", exc, started)
        return EnvSummary(name, "?", 0, 0, 1, time.perf_counter() - started), [failure]
    config = builder.config_names()[0]
    build, rows = _build(name, builder, config, out)
    results = [build]
    checked = time.perf_counter()
    try:
        results += check_env(builder, configs=[config], max_rows=max_rows)
    except Exception as exc:  # the checker itself failed on this env: report it with the env's name
        results.append(CheckResult.failure(name, "check_env", exc, checked))
    summary = EnvSummary(name, builder.KIND, rows, sum(r.ok for r in results), len(results),
                         time.perf_counter() - started)
    return summary, results


def _build(name: str, builder: type[TaskBuilder], config: str, out: Path) -> tuple[CheckResult, int]:
    """Write the config's splits as Parquet; the rows are counted from the files read back."""
    started = time.perf_counter()
    try:
        files = build_files(builder, config, out / name)
        rows = sum(count_rows(f) for f in files)
    except Exception as exc:  # reported as a failed check; the conformance checks still run
        return CheckResult.failure(name, "build", exc, started), 0
    message = f"{rows} rows in {len(files)} files under {out / name / config}"
    return CheckResult(env=name, check="build", ok=rows > 0, message=message,
                       seconds=time.perf_counter() - started), rows
