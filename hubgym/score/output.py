"""The output of a re-score: a run folder laid out as the rollout writer lays one out.

    OUT/
      shards/w000of001-00000.arrow     every original column + rescore_* columns (Arrow IPC file)
      manifest-w000of001.json          sources, verifiers (module + sha256), counts, and each shard's rows and sha256

So `hubgym report`, `hubgym push-rollouts` and the trainer's stream read it like any run. A re-score is all
or nothing: its shards are written under hidden names (`shards/.partial-<id>-...`, which no reader reads),
and only once every row is scored does `finish` remove the previous re-score in OUT (only its own files),
write the manifest and give the shards their names. A re-score that fails, is stopped, or is killed leaves
OUT as it found it, a previous re-score included (a kill leaves hidden files, removed by the next re-score).
One re-score writes to OUT at a time (a lock held while it runs).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

from hubgym.errors import RescoreError
from hubgym.files import atomic_write_bytes
from hubgym.hub.manifest import read_run_manifest
from hubgym.rollout.runlock import RunLock
from hubgym.rollout.writer import worker_name
from hubgym.schemas.version import SCHEMA_VERSION

WORKER = worker_name(0, 1)
MANIFEST = f"manifest-{WORKER}.json"
PARTIAL = ".partial-"  # staged shards: hidden, so a reader never takes them for a run


class RescoreOutput:
    def __init__(self, out: str | Path, sources: list[Path]):
        self.dir = Path(out)
        self.shard_dir = self.dir / "shards"
        _check_apart(self.dir, sources)
        self._lock = RunLock(self.dir, "rescore")
        try:
            _previous(self.dir)  # refuses a folder holding another kind of run before any work is done
            for stale in self.shard_dir.glob(f"{PARTIAL}*"):  # left by a killed re-score
                stale.unlink()
        except BaseException:
            self._lock.release()
            raise
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        self._stage = f"{PARTIAL}{uuid.uuid4().hex[:8]}-"
        self.files: dict[str, dict[str, Any]] = {}

    def path(self, index: int) -> Path:
        """Where output shard `index` is written (its input shard's or batch's place in the source), staged."""
        return self.shard_dir / f"{self._stage}{_name(index)}"

    def record(self, written: dict[str, Any]) -> None:
        """Note a shard written to `path(...)` (by this process or a worker): its name, rows and sha256."""
        self.files[written["name"].removeprefix(self._stage)] = {"rows": written["rows"], "sha256": written["sha256"]}

    def shards(self) -> list[Path]:
        """The output shards, under the names `finish` gives them."""
        return [self.shard_dir / name for name in self.files]

    def finish(self, run_id: str, rescore: dict[str, Any], envs: dict[str, dict],
               run_ids: list[str] | None = None) -> Path:
        """Replace the previous re-score with this one: the manifest first, then the shards' names (a kill in
        between leaves a manifest naming shards that are missing or not its own, which readers refuse). `run_ids`:
        the runs whose rows it re-scored (its rows keep their run ids; readers hold them to this list)."""
        stale = [p for p in _previous(self.dir) if p.name not in self.files and p.name != MANIFEST]
        manifest = {
            "schema_version": SCHEMA_VERSION, "run_id": run_id, "worker": WORKER, "kind": "rescore",
            **({"run_ids": run_ids} if run_ids is not None else {}),
            "rescore": rescore, "envs": envs, "rows": sum(f["rows"] for f in self.files.values()),
            "shards": list(self.files), "shard_files": self.files,
            "updated_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        }
        path = self.dir / MANIFEST
        atomic_write_bytes(path, json.dumps(manifest, indent=2, sort_keys=True, default=str).encode())
        for name in self.files:
            (self.shard_dir / f"{self._stage}{name}").replace(self.shard_dir / name)
        for old in stale:  # the previous re-score's files this one does not replace
            old.unlink()
        return path

    def close(self) -> None:
        """Remove what this re-score staged and did not finish (a skipped shard's, or all of a failed one's)."""
        for staged in self.shard_dir.glob(f"{self._stage}*"):
            staged.unlink(missing_ok=True)
        self._lock.release()


def _name(index: int) -> str:
    return f"{WORKER}-{index:05d}.arrow"


def _check_apart(out: Path, sources: list[Path]) -> None:
    """OUT must not overlap a source: its shards would be read as rollouts, or a source's shards replaced."""
    target = out.resolve()
    for source in sources:
        path = source.resolve()
        inside = path.is_dir() and (target == path or path in target.parents)  # OUT in a source folder
        if inside or target in path.parents:  # or a source in OUT
            raise RescoreError(f"--out {out} overlaps the source {source}: re-scored shards would mix with the "
                               f"stored ones; write them to a folder of their own, e.g. --out {source}-rescored")


def _previous(out: Path) -> list[Path]:
    """A previous re-score's files in OUT; RescoreError if OUT holds anything else's run."""
    manifests = sorted(out.glob("manifest-*.json"))
    for manifest in manifests:
        if read_run_manifest(manifest).get("kind") != "rescore":  # a damaged one is ManifestError naming it
            raise RescoreError(f"{out} holds a rollout run ({manifest.name}); re-scored shards go to a folder of "
                               f"their own: choose another --out")
    return [*out.glob(f"shards/{WORKER}-*.arrow"), *manifests]
