"""The output of a re-score: a run folder laid out as the rollout writer lays one out.

    OUT/
      shards/w000of001-00000.arrow     every original column + rescore_* columns (Arrow IPC file)
      manifest-w000of001.json          written last: sources, verifiers (module + sha256), counts,
                                       and each shard's rows and sha256

So `hubgym report`, `hubgym push-rollouts` and the trainer's stream read it like any run. Shards
are written atomically and the manifest after the last one: a folder without a manifest is an
interrupted re-score. Running again replaces the previous re-score in OUT (only its own files).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from hubgym.errors import RescoreError
from hubgym.files import atomic_write_bytes
from hubgym.hub.manifest import read_run_manifest
from hubgym.rollout.writer import worker_name
from hubgym.schemas.version import SCHEMA_VERSION

WORKER = worker_name(0, 1)
MANIFEST = f"manifest-{WORKER}.json"


class RescoreOutput:
    def __init__(self, out: str | Path, sources: list[Path]):
        self.dir = Path(out)
        self.shard_dir = self.dir / "shards"
        _check_apart(self.dir, sources)
        _clear_previous(self.dir)
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, dict[str, Any]] = {}

    def path(self, index: int) -> Path:
        """Where output shard `index` goes (its input shard's or batch's place in the source)."""
        return self.shard_dir / f"{WORKER}-{index:05d}.arrow"

    def record(self, written: dict[str, Any]) -> None:
        """Note a shard written to `path(...)` (by this process or a worker): its name, rows and sha256."""
        self.files[written["name"]] = {"rows": written["rows"], "sha256": written["sha256"]}

    def shards(self) -> list[Path]:
        return [self.shard_dir / name for name in self.files]

    def finish(self, run_id: str, rescore: dict[str, Any], envs: dict[str, dict]) -> Path:
        manifest = {
            "schema_version": SCHEMA_VERSION, "run_id": run_id, "worker": WORKER, "kind": "rescore",
            "rescore": rescore, "envs": envs, "rows": sum(f["rows"] for f in self.files.values()),
            "shards": list(self.files), "shard_files": self.files,
            "updated_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        }
        path = self.dir / MANIFEST
        atomic_write_bytes(path, json.dumps(manifest, indent=2, sort_keys=True, default=str).encode())
        return path


def _check_apart(out: Path, sources: list[Path]) -> None:
    """OUT must not overlap a source: its shards would be read as rollouts, or a source's shards replaced."""
    target = out.resolve()
    for source in sources:
        path = source.resolve()
        inside = path.is_dir() and (target == path or path in target.parents)  # OUT in a source folder
        if inside or target in path.parents:  # or a source in OUT
            raise RescoreError(f"--out {out} overlaps the source {source}: re-scored shards would mix with the "
                               f"stored ones; write them to a folder of their own, e.g. --out {source}-rescored")


def _clear_previous(out: Path) -> None:
    """Remove a previous re-score's files from OUT; refuse a folder that holds anything else's run."""
    manifests = sorted(out.glob("manifest-*.json"))
    for manifest in manifests:
        if read_run_manifest(manifest).get("kind") != "rescore":  # a damaged one is ManifestError naming it
            raise RescoreError(f"{out} holds a rollout run ({manifest.name}); re-scored shards go to a folder of "
                               f"their own: choose another --out")
    for stale in [*out.glob(f"shards/{WORKER}-*.arrow"), *manifests]:
        stale.unlink()
