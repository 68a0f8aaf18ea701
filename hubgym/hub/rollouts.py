"""Rollout runs on a hub: push a run folder as one config of a rollout dataset repo; read rows back.

    push_rollouts("runs/r1", "me/rollouts", hub="hubs/local")    # -> RolloutPush(ref="me/rollouts@<rev>:<run>")
    rows = iter_rollout_rows(["me/rollouts@<rev>:<run>"])          # dicts, shard by shard
    load_dataset(snapshot_path, "<run>", streaming=True)           # the same rows through `datasets`

Repo layout: `<run>/shards/*.arrow` (the writer's Arrow IPC shards, unchanged), `<run>/manifest-*.json`
and `<run>/index.json` (sha256 and row count of every shard), plus a README whose YAML `configs:`
has one config per run, so `datasets.load_dataset(REPO, RUN)` works with no remote code.

Every shard is validated (opens as Arrow, has the rollout schema, row count) before it is
uploaded, so a partial shard is never published. Shards go up in commits of a few at a time and
a re-run skips those already in the repo with the same sha256: an interrupted push resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import yaml

from hubgym.errors import HubgymError, NoShardsError
from hubgym.hub.base import HubBackend, get_hub, parse_ref
from hubgym.schemas.rollouts import ROLLOUT_SCHEMA


class ShardError(HubgymError, ValueError):
    """A rollout shard that is truncated, corrupted or not a rollout table; the message names the file."""


@dataclass(frozen=True)
class RolloutPush:
    repo: str
    revision: str
    name: str  # the run's config name in the repo
    uploaded: int  # shards uploaded by this call
    skipped: int  # shards already in the repo (resume)
    rows: int

    @property
    def ref(self) -> str:
        return f"{self.repo}@{self.revision}:{self.name}"


def shard_rows(path: Path) -> int:
    """Open a shard as an Arrow IPC file, check its schema and count its rows; ShardError if it cannot."""
    try:
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source)
            bad = [f.name for f in ROLLOUT_SCHEMA if reader.schema.get_field_index(f.name) < 0
                   or not reader.schema.field(f.name).type.equals(f.type)]
            if bad:  # extra columns (e.g. re-scoring's) are fine; every rollout column must be there, typed right
                raise ShardError(f"shard {path} does not have the rollout schema (missing or mistyped: "
                                 f"{', '.join(bad[:8])}); was it written by hubgym's ShardWriter?")
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ShardError(f"shard {path} is truncated or corrupted ({exc}); delete it and re-run the rollout "
                         f"(it resumes and rewrites only what is missing)") from None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def push_rollouts(run_dir: str | Path, repo: str, *, hub: HubBackend | str | os.PathLike | None = None,
                  name: str | None = None, shards_per_commit: int = 8) -> RolloutPush:
    """Upload a run folder (all its workers' shards and manifests) as config `name` (default: the run id)."""
    run_dir, backend = Path(run_dir), get_hub(hub)
    manifests = sorted(run_dir.glob("manifest-*.json"))
    shards = sorted(p for p in (run_dir / "shards").glob("*.arrow") if not p.name.startswith("."))
    if not manifests or not shards:
        raise NoShardsError(f"{run_dir} is not a rollout run folder (no manifest-*.json or shards/*.arrow); "
                            f"give the --out folder of `hubgym rollout`")
    name = name or json.loads(manifests[0].read_text())["run_id"]
    index = {p.name: {"sha256": sha256(p), "rows": shard_rows(p)} for p in shards}
    backend.create_repo(repo)
    present = _present_shards(backend, repo, name)
    todo = [p for p in shards if present.get(p.name) != index[p.name]["sha256"]]
    for start in range(0, len(todo), shards_per_commit):
        chunk = todo[start:start + shards_per_commit]
        backend.commit(repo, {f"{name}/shards/{p.name}": p for p in chunk},
                       f"Upload {len(chunk)} shard(s) of run {name}")
    files: dict[str, Any] = {f"{name}/{m.name}": m for m in manifests}
    files[f"{name}/index.json"] = json.dumps(index, indent=2, sort_keys=True).encode()
    files[f"{name}/summary.json"] = json.dumps(_summary(shards), indent=2, sort_keys=True).encode()
    files["README.md"] = _card(backend, repo, name, manifests, index).encode()
    revision = backend.commit(repo, files, f"Run {name}: {sum(i['rows'] for i in index.values())} rollouts")
    return RolloutPush(repo, revision, name, len(todo), len(shards) - len(todo), sum(i["rows"] for i in index.values()))


def _present_shards(backend: HubBackend, repo: str, name: str) -> dict[str, str]:
    """{shard file name: sha256} of the run's shards already in the repo's head revision."""
    snapshot = backend.resolve(repo, patterns=[f"{name}/shards/*"])
    folder = snapshot.path / name / "shards"
    return {p.name: sha256(p) for p in folder.glob("*.arrow")} if folder.exists() else {}


def _card(backend: HubBackend, repo: str, name: str, manifests: list[Path], index: dict) -> str:
    """README: YAML `configs:` (one per run in the repo) and a summary of every run, rebuilt from the runs' files."""
    snapshot = backend.resolve(repo, patterns=["*/index.json", "*/summary.json", "*/manifest-*.json"])
    runs = {p.parent.name: (json.loads(p.read_text()), _first_json(p.parent, "manifest-*.json"),
                            _first_json(p.parent, "summary.json"))
            for p in snapshot.path.glob("*/index.json")}
    runs[name] = (index, json.loads(manifests[0].read_text()), _summary(sorted((manifests[0].parent / "shards")
                                                                              .glob("*.arrow"))))
    meta = {"configs": [{"config_name": run, "data_files": [{"split": "train", "path": f"{run}/shards/*.arrow"}]}
                        for run in sorted(runs)]}
    sections = [_run_section(repo, run, *runs[run]) for run in sorted(runs)]
    return ("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n" + f"# Rollouts: {repo}\n\n"
            "Rollout runs made with hubgym (Arrow shards with token ids, logprobs, masks, rewards and provenance), "
            "one config per run.\n\n" + "\n".join(sections))


def _summary(shards: list[Path]) -> dict[str, dict]:
    """Rollouts and mean reward per env (for the card)."""
    import polars as pl

    frame = pl.concat([pl.scan_ipc(p).select("env", "reward") for p in shards if not p.name.startswith(".")])
    table = frame.group_by("env").agg(pl.len().alias("rollouts"), pl.col("reward").mean().alias("mean_reward"))
    return {r["env"]: {"rollouts": r["rollouts"], "mean_reward": r["mean_reward"]} for r in table.collect().to_dicts()}


def _first_json(folder: Path, pattern: str) -> dict:
    found = sorted(folder.glob(pattern))
    return json.loads(found[0].read_text()) if found else {}


def _run_section(repo: str, run: str, index: dict, manifest: dict, summary: dict) -> str:
    def reward(env: str) -> str:
        value = (summary.get(env) or {}).get("mean_reward")
        return f", mean reward {value:.3f}" if value is not None else ""

    envs = "".join(f"- env `{env}` (config {e.get('config')}, {e.get('tasks')} tasks{reward(env)}), verifier "
                   f"`{e.get('verifier_module')}` (sha256 {str(e.get('verifier_sha256'))[:12]}), "
                   f"env repo {e.get('env_repo') or '-'}@{e.get('env_revision') or '-'}\n"
                   for env, e in sorted((manifest.get("envs") or {}).items()))
    return (f"## Run `{run}`\n\n- model: `{manifest.get('model')}`, policy version {manifest.get('policy_version')}\n"
            f"- sampling: `{json.dumps(manifest.get('sampling'), sort_keys=True)}`\n"
            f"- rollouts: {sum(i['rows'] for i in index.values())} in {len(index)} shard(s)\n{envs}\n"
            f"Load: `datasets.load_dataset(\"{repo}\", \"{run}\", split=\"train\", streaming=True)`\n")


def parse_rollout_ref(ref: str) -> tuple[str, str | None, str | None]:
    """`org/name[@revision][:RUN]` -> (repo, revision, run)."""
    head, _, run = ref.partition(":")
    repo, revision = parse_ref(head)
    return repo, revision, run or None


def rollout_shards(source: str | Path, *, hub: HubBackend | str | os.PathLike | None = None,
                   verify: bool = True) -> list[Path]:
    """Local shard files of a source: a shard file, a run folder, or a hub ref (fetched, checked against index.json)."""
    files = []
    for path, expected in _shards(source, hub):
        if verify:
            _verify(path, expected)
        files.append(path)
    return files


def _shards(source: str | Path, hub) -> list[tuple[Path, str | None]]:
    """(local file, expected sha256 or None) of every shard of a source."""
    path = Path(source)
    if path.exists():
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*.arrow") if not p.name.startswith("."))
        return [(p, None) for p in found]
    repo, revision, run = parse_rollout_ref(str(source))
    snapshot = get_hub(hub).resolve(repo, revision, patterns=[f"{run}/*", f"{run}/**"] if run else None)
    runs = [run] if run else sorted(p.parent.name for p in snapshot.path.glob("*/index.json"))
    files = []
    for name in runs:
        index_path = snapshot.path / name / "index.json"
        if not index_path.exists():
            raise NoShardsError(f"{repo}@{snapshot.revision} has no run {name!r}; runs: "
                                f"{', '.join(p.parent.name for p in snapshot.path.glob('*/index.json')) or 'none'}")
        for shard, meta in sorted(json.loads(index_path.read_text()).items()):
            files.append((snapshot.path / name / "shards" / shard, meta["sha256"]))
    return files


def _verify(path: Path, expected: str | None) -> None:
    if expected is not None and sha256(path) != expected:
        raise ShardError(f"shard {path.parent.parent.name}/shards/{path.name} ({path}) does not match its sha256 "
                         f"in index.json: it is corrupted; re-push the run")


def iter_rollout_batches(sources: list[str | Path], *, hub: HubBackend | str | os.PathLike | None = None,
                         skip_bad: bool = False, counts: dict | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of every source's shards, in order; a bad shard raises ShardError (or is skipped and counted)."""
    for source in sources:
        for path, expected in _shards(source, hub):
            try:
                _verify(path, expected)
                shard_rows(path)
            except ShardError:
                if not skip_bad:
                    raise
                if counts is not None:
                    counts["bad_shards"] = counts.get("bad_shards", 0) + 1
                continue
            with pa.memory_map(str(path)) as mm:
                reader = pa.ipc.open_file(mm)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)


def iter_rollout_rows(sources: list[str | Path], *, hub: HubBackend | str | os.PathLike | None = None,
                      skip_bad: bool = False, counts: dict | None = None) -> Iterator[dict[str, Any]]:
    """Rows of every source, one record batch at a time (memory stays bounded by one batch).

    `info` (a JSON column) comes back as the dict it was, as `datasets` decodes it.
    """
    for batch in iter_rollout_batches(sources, hub=hub, skip_bad=skip_bad, counts=counts):
        for row in batch.to_pylist():
            yield decode_row(row)


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    if isinstance(row.get("info"), str):
        row["info"] = json.loads(row["info"])
    return row
