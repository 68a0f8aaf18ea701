"""Build an environment's tasks: into a `datasets` Dataset, or into Parquet/Arrow files on disk."""

from __future__ import annotations

import tempfile
from pathlib import Path

import datasets

from hubgym.builders.base import TaskBuilder
from hubgym.envs.resolve import resolve_env


_BUILD_DIRS: list[tempfile.TemporaryDirectory] = []
"""Build caches of this process: the returned datasets memory-map them, so they are removed at exit."""


def make_builder(env: str | type[TaskBuilder], config: str | None = None, cache_dir: str | Path | None = None,
                 max_rows: int | None = None) -> TaskBuilder:
    """Instantiate a builder; `cache_dir` defaults to a fresh temporary folder (no shared cache state); `max_rows`
    caps every split's size (a config override: the same generator, its first rows)."""
    cls = resolve_env(env)
    if cache_dir is None:
        _BUILD_DIRS.append(tempfile.TemporaryDirectory(prefix="hubgym-build-"))
        cache_dir = _BUILD_DIRS[-1].name
    name = config or cls.config_names()[0]
    sizes = getattr(next((c for c in cls.BUILDER_CONFIGS if c.name == name), None), "sizes", None)
    overrides = {"sizes": {s: min(n, max_rows) for s, n in sizes.items()}} if max_rows and sizes else {}
    # dataset_name names the files (`<env>-<split>.parquet`); by default datasets derives it from the module name
    return cls(config_name=name, cache_dir=str(cache_dir), dataset_name=cls.ENV, **overrides)


def build_tasks(env: str | type[TaskBuilder], config: str | None = None, *, cache_dir: str | Path | None = None,
                max_rows: int | None = None) -> datasets.DatasetDict:
    """Generate every split of one config (each at most `max_rows` rows) and return it as a DatasetDict."""
    builder = make_builder(env, config, cache_dir, max_rows)
    builder.download_and_prepare(download_mode="force_redownload", verification_mode="no_checks")
    return builder.as_dataset()


def build_files(env: str | type[TaskBuilder], config: str | None, out_dir: str | Path,
                file_format: str = "parquet") -> list[Path]:
    """Write one config's splits as `<out_dir>/<config>/<env>-<split>.<fmt>` shards; return the files.

    datasets writes lock files beside its output folder (`<folder>_builder.lock`, `<folder>.incomplete_info.lock`);
    the build runs in a staging folder inside `out_dir`, so only the built files (and dataset_info.json) land there.
    """
    builder = make_builder(env, config)
    out_dir = Path(out_dir)
    target = out_dir / builder.config.name
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".hubgym-build-", dir=out_dir) as staging:
        built = Path(staging) / builder.config.name
        builder.download_and_prepare(output_dir=str(built), file_format=file_format,
                                     download_mode="force_redownload", verification_mode="no_checks")
        target.mkdir(exist_ok=True)
        for path in sorted(built.iterdir()):
            path.replace(target / path.name)  # a rename: the staging folder is on the same filesystem
    return sorted(target.glob(f"*.{file_format}"))
