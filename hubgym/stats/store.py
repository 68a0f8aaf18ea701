"""Task statistics on disk and on a hub: a folder of Parquet files plus a small JSON manifest and a card.

    write_stats(stats, "stats/")                       # atomic: the folder appears whole or not at all
    stats = read_stats("stats/")                        # checked: format, schema version, columns, sha256
    pushed = push_stats(stats, "me/task-stats")        # one commit; pushed.ref pins it
    stats = load_stats(["me/task-stats", "runs/r3"])   # stats datasets and rollout sources, merged
    datasets.load_dataset("me/task-stats", split="train")   # the per-task table, no hubgym needed

Layout: `tasks.parquet` (one row per env and task: what users read), `parts.parquet` (one row per env, task
and run: what merges read, so merges stay exact), `stats.json` (format, schema version, counts, runs, and
the sha256 and rows of both files) and `README.md` (a card whose `configs:` name both files).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import polars as pl

from hubgym.errors import ManifestError, NoShardsError
from hubgym.files import replace_dir, sha256_file
from hubgym.hub.manifest import read_json_object
from hubgym.stats.table import PART_SCHEMA, TaskStats

FORMAT = "hubgym-task-stats"
STATS_SCHEMA_VERSION = "1.0"
"""Version of the parts table; a stats dataset of another version is refused, never merged."""
MANIFEST = "stats.json"
TASKS_FILE, PARTS_FILE, CARD_FILE = "tasks.parquet", "parts.parquet", "README.md"
STATS_FIX = "recompute it from its runs: `hubgym stats RUN... --out DIR`"


@dataclass(frozen=True)
class StatsPush:
    repo: str
    revision: str  # the commit holding these stats

    @property
    def ref(self) -> str:
        return f"{self.repo}@{self.revision}"


def write_stats(stats: TaskStats, out: str | os.PathLike) -> Path:
    """Write the stats folder beside `out`, then move it into place: readers see the old folder or the new one."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        _write_files(stats, staged)
        replace_dir(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # gone after a successful move; a failed write leaves nothing
    return out


def _write_files(stats: TaskStats, folder: Path) -> None:
    folder.mkdir(parents=True)
    tasks = stats.tasks()
    tasks.write_parquet(folder / TASKS_FILE)
    stats.parts.write_parquet(folder / PARTS_FILE)
    files = {name: {"sha256": sha256_file(folder / name), "rows": rows}
             for name, rows in ((TASKS_FILE, len(tasks)), (PARTS_FILE, len(stats.parts)))}
    summary = stats.summary()
    manifest = {"format": FORMAT, "schema_version": STATS_SCHEMA_VERSION, "tasks": len(tasks),
                "samples": int(tasks["samples"].sum()), "runs": stats.runs, "files": files,
                "envs": {row.pop("env"): row for row in summary.iter_rows(named=True)}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    (folder / CARD_FILE).write_text(render_card(manifest))


def render_card(manifest: Mapping[str, Any]) -> str:
    """The dataset card: `configs:` so `load_dataset(REPO)` reads tasks.parquet, and a table per env."""
    lines = ["---", "configs:", "- config_name: default", "  data_files:", "  - split: train",
             f"    path: {TASKS_FILE}", "- config_name: parts", "  data_files:", "  - split: train",
             f"    path: {PARTS_FILE}", "tags:", "- hubgym", "- task-stats", "---", "",
             "# Task statistics (hubgym)", "",
             f"{manifest['tasks']} tasks, {manifest['samples']} scored samples, {len(manifest['runs'])} runs. "
             "One row per env and task: samples, mean reward, pass rate, last policy version, runs. Merge new runs "
             "with `hubgym stats RUN... --merge REPO --push REPO`.", "",
             "| env | tasks | samples | mean pass rate | share of tasks with 0 < pass rate < 1 |",
             "| --- | --- | --- | --- | --- |"]
    for env, row in sorted(manifest["envs"].items()):
        lines.append(f"| {env} | {row['tasks']} | {row['samples']} | {_num(row['mean_pass_rate'])} | "
                     f"{_num(row['signal'])} |")
    return "\n".join(lines) + "\n"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def read_stats(folder: str | os.PathLike, name: str | None = None) -> TaskStats:
    """A stats folder (or a hub snapshot of one), checked before use; `name` is how messages call it."""
    folder, name = Path(folder), name or str(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{name} is not a task-stats dataset (it has no {MANIFEST}); {STATS_FIX}", path=name)
    # read as every stored JSON file is (bounded, regular, UTF-8, nested no deeper than Python parses)
    manifest = read_json_object(path, lambda problem, field=None: ManifestError(
        f"{name}/{MANIFEST} {problem}; {STATS_FIX}", path=name))
    if manifest.get("format") != FORMAT:
        raise ManifestError(f"{name}/{MANIFEST} is not a {FORMAT} manifest; {STATS_FIX}", path=name)
    if manifest.get("schema_version") != STATS_SCHEMA_VERSION:
        raise ManifestError(f"{name} has stats schema version {manifest.get('schema_version')!r}, this hubgym reads "
                            f"{STATS_SCHEMA_VERSION!r}, so the two cannot be merged; {STATS_FIX}", path=name)
    recorded = (manifest.get("files") or {}).get(PARTS_FILE) or {}
    parts_path = folder / PARTS_FILE
    if not parts_path.is_file() or sha256_file(parts_path) != recorded.get("sha256"):
        raise ManifestError(f"{name}/{PARTS_FILE} is missing or changed after it was written (its sha256 is not the "
                            f"one {MANIFEST} records); {STATS_FIX}", path=name)
    parts = pl.read_parquet(parts_path)
    if parts.schema != PART_SCHEMA:
        raise ManifestError(f"{name}/{PARTS_FILE} has columns {dict(parts.schema)}, not the stats schema "
                            f"{STATS_SCHEMA_VERSION}'s {dict(PART_SCHEMA)}; {STATS_FIX}", path=name)
    return TaskStats(parts)


def push_stats(stats: TaskStats, repo: str, *, hub: Any = None, replace: bool = False) -> StatsPush:
    """Add the stats to `repo` in one commit: the stats it holds are merged in first, so a push never drops runs
    pushed before (runs both hold count once); `replace=True` commits these stats alone. The same stats again make
    no commit. A repo that holds something else (an env, rollouts) is refused, never overwritten."""
    from hubgym.hub.factory import get_hub

    backend = get_hub(hub)
    backend.create_repo(repo)
    held = _hub_stats(repo, None, backend, refuse_other=True)
    if held is not None and not replace:
        stats = stats.merge(held)
    with tempfile.TemporaryDirectory(prefix="hubgym-stats-") as tmp:
        folder = Path(tmp) / "stats"
        _write_files(stats, folder)
        files = {name: folder / name for name in (TASKS_FILE, PARTS_FILE, MANIFEST, CARD_FILE)}
        revision = backend.commit(repo, files, f"Task stats: {stats.tasks().height} tasks, {len(stats.runs)} runs",
                                  replace=True)
    return StatsPush(repo, revision)


def load_stats(sources: str | os.PathLike | Sequence[str | os.PathLike], *, hub: Any = None,
               thresholds: Mapping[str, float] | None = None, stats_only: bool = False,
               skip_bad: bool = False) -> TaskStats:
    """Stats datasets (folders, hub repos `org/name[@rev]`) and, unless `stats_only`, rollout sources (run
    folders, shard files, rollout repos), all merged."""
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    merged, rollouts = TaskStats(), []
    for source in items:
        found = open_stats(source, hub)
        if found is not None:
            merged = merged.merge(found)
        elif stats_only:
            raise ManifestError(f"{source} is not a task-stats dataset (no {MANIFEST}): give a folder written by "
                                f"`hubgym stats --out` or a repo pushed by `hubgym stats --push`", path=str(source))
        else:
            rollouts.append(source)
    if rollouts:
        merged = merged.merge(TaskStats.from_rollouts(rollouts, hub=hub, thresholds=thresholds, skip_bad=skip_bad))
    return merged


def open_stats(source: str | os.PathLike, hub: Any = None) -> TaskStats | None:
    """The stats a folder or hub repo holds; None when it is something else (e.g. rollouts)."""
    path = Path(source)
    if path.exists():
        return read_stats(path) if (path / MANIFEST).is_file() else None
    text = str(source)
    if "/" not in text or text.startswith((".", "/", "~")):
        raise NoShardsError(f"{source} does not exist; give a run folder, a stats folder or a hub repo org/name")
    if ":" in text:
        return None  # org/name[@rev]:RUN names a rollout run
    from hubgym.errors import EnvNotFoundError
    from hubgym.hub.base import parse_ref
    from hubgym.hub.factory import get_hub

    repo, revision = parse_ref(text)
    backend = get_hub(hub)
    try:
        return _hub_stats(repo, revision, backend)
    except EnvNotFoundError as exc:
        raise NoShardsError(f"{source} is not a folder here, nor a repo on the {backend.name} hub: {exc}") from None


def _hub_stats(repo: str, revision: str | None, backend: Any, refuse_other: bool = False) -> TaskStats | None:
    """The stats a hub repo revision holds, or None; with `refuse_other`, a repo holding other files is an error."""
    from hubgym.hub.base import GITATTRIBUTES

    head = backend.resolve(repo, revision, patterns=[MANIFEST, CARD_FILE, "*.json", GITATTRIBUTES])  # small files
    if not (head.path / MANIFEST).is_file():
        other = sorted(str(p.relative_to(head.path)) for p in head.path.rglob("*")
                       if p.is_file() and p.name != GITATTRIBUTES)
        if refuse_other and other:
            raise ManifestError(f"{repo} on the {backend.name} hub holds other files ({', '.join(other[:3])}), not "
                                f"task stats; push stats to a repo of their own", path=repo)
        return None
    snapshot = backend.resolve(repo, head.revision, patterns=[MANIFEST, PARTS_FILE, GITATTRIBUTES])
    return read_stats(snapshot.path, f"{repo}@{snapshot.revision}")
