"""Rollout runs on a hub: push a run folder as one config of a rollout dataset repo; read rows back.

    pushed = push_rollouts("runs/r1", "me/rollouts", hub="hf")      # -> RolloutPush(ref="me/rollouts@<rev>:<run>")
    rows = iter_rollouts(pushed.ref)                                 # dicts, streamed shard by shard, verified
    ds = open_rollouts(pushed.ref)                                   # a datasets IterableDataset of the same rows
    datasets.load_dataset("me/rollouts", "<run>", split="train", streaming=True)   # no hubgym needed

Repo layout: `<run>/shards/*.arrow` (the writer's Arrow IPC shards, byte for byte), `<run>/manifest-*.json`
(the workers' run manifests), `<run>/index.json` (sha256 and rows of every shard, and the run's
features), `<run>/summary.json` (provenance and per-worker stats), and a README whose YAML `configs:`
lists every run of the repo, so `datasets.load_dataset(REPO, RUN)` works with no remote code.

Every shard is checked before anything is uploaded (it opens as an Arrow IPC file, every batch
passes Arrow's full validation and the writer's rules (hub/shard_checks.py), it has the rollout schema, its
rows and sha256 match the run manifest, and no rollout is in two shards): a partial, corrupted or crafted
shard is never published. Shards go up in commits of about
`batch_bytes`, each commit also updating index.json; a re-run skips the shards the repo's index
already lists with the same sha256, so an interrupted push resumes with no duplicate.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from hubgym.errors import NoShardsError, ShardError
from hubgym.hub.base import GITATTRIBUTES, HubBackend, check_name
from hubgym.hub.factory import get_hub
from hubgym.hub.manifest import INDEX_FIX, StoredFile, read_index, read_run_manifest
from hubgym.hub.rollout_card import merge_summaries, read_summary, render_card, run_summary
from hubgym.hub.rollout_reader import (  # noqa: F401  (the reading half, re-exported)
    INDEX_FILE, RolloutShards, decode_row, iter_batches, iter_rollouts,
    open_rollouts, parse_rollout_ref, recorded_run_ids, recorded_shards, shard_sources, shard_worker,
)
from hubgym.hub.shard_checks import SeenRollouts
from hubgym.files import sha256_file
from hubgym.hub.shards import ShardSource, load_shard

SUMMARY_FILE = "summary.json"

__all__ = ["RolloutPush", "ShardError", "iter_batches", "iter_rollouts", "open_rollouts", "push_rollouts"]


@dataclass(frozen=True)
class RolloutPush:
    repo: str
    revision: str  # the commit holding the whole run
    name: str  # the run's config name in the repo
    uploaded: int  # shards uploaded by this call
    skipped: int  # shards the repo already held with the same sha256 (resume)
    rows: int  # rollouts of the run in the repo
    commits: int  # commits made by this call

    @property
    def ref(self) -> str:
        """`org/name@<commit>:<run>`: reads exactly this run at this revision again."""
        return f"{self.repo}@{self.revision}:{self.name}"


def push_rollouts(run_dir: str | os.PathLike, repo: str, *, hub: HubBackend | str | os.PathLike | None = None,
                  name: str | None = None, batch_bytes: int = 512 << 20, progress: bool = False) -> RolloutPush:
    """Upload a run folder (all its workers' shards and manifests) as config `name` (default: the run id)."""
    run_dir, backend = Path(run_dir), get_hub(hub)
    manifests = sorted(run_dir.glob("manifest-*.json"))
    shards = sorted(p for p in (run_dir / "shards").glob("*.arrow") if not p.name.startswith("."))
    if not manifests or not shards:
        raise NoShardsError(f"{run_dir} is not a rollout run folder (no manifest-*.json or shards/*.arrow); give the "
                            f"--out folder of `hubgym rollout`")
    name = _check_name(name or read_run_manifest(manifests[0])["run_id"] or run_dir.name)
    local, features = check_shards(shards, recorded_shards(run_dir), recorded_run_ids(run_dir))
    backend.create_repo(repo)
    index, head = _repo_index(backend, repo, name)
    todo = [p for p in shards if index["shards"].get(p.name, {}).get("sha256") != local[p.name]["sha256"]]
    index["features"] = features
    commits = 0
    for batch in _progress(_batches(todo, batch_bytes), len(todo), name, progress):
        index["shards"].update({p.name: local[p.name] for p in batch})
        files: dict[str, Any] = {f"{name}/shards/{p.name}": p for p in batch}
        files[f"{name}/{INDEX_FILE}"] = _index_json(index)
        head = backend.commit(repo, files, f"Run {name}: {len(batch)} shard(s)")
        commits += 1
    index["shards"].update(local)
    revision, card_commits = _finish(backend, repo, name, index, shards, manifests, head)
    return RolloutPush(repo, revision, name, len(todo), len(shards) - len(todo),
                       sum(s["rows"] for s in index["shards"].values()), commits + card_commits)


def check_shards(shards: list[Path], recorded: dict[str, dict],
                 owners: dict[str, frozenset[str] | None] | None = None) -> tuple[dict[str, dict], dict]:
    """{file: {"sha256", "rows"}} of shards that pass every check (the row contract, and the run ids their
    workers' manifests record, `owners`), and their (common) features; else ShardError."""
    gone = sorted(set(recorded) - {p.name for p in shards})
    if gone:  # a partial run is never published
        missing = shards[0].parent / gone[0]
        raise ShardError(f"shard {missing} is listed in its run's manifest but missing; re-run the rollout (it "
                         f"resumes and rewrites only what is missing)", shard=str(missing))
    out, features, seen = {}, None, SeenRollouts()
    for path in shards:
        info = recorded.get(path.name, {})
        ids = (owners or {}).get(shard_worker(path.name))
        loaded = load_shard(ShardSource(str(path), str(path), None, info.get("rows"), run_ids=ids))  # sha256: below
        sha = sha256_file(path)
        if info.get("sha256") not in (None, sha):
            raise ShardError(f"shard {path} changed after it was written: its sha256 is {sha}, the run manifest "
                             f"records {info['sha256']}. Delete it and re-run the rollout (it resumes)",
                             shard=str(path))
        seen.add(loaded.source.name, loaded.ids)  # a rollout two shards hold is never published
        mine = _features(loaded.reader.schema, path)
        if features is not None and mine != features:
            raise ShardError(f"shard {path} has other columns than {shards[0].name}; a run's shards share one schema "
                             f"(push re-scored shards as a run of their own)", shard=str(path))
        out[path.name], features = {"sha256": sha, "rows": loaded.rows}, mine
    return out, features or {}


def _features(schema, path: Path) -> dict:
    """The `datasets` features a shard's schema declares (its `huggingface` metadata), published in index.json:
    ShardError when they do not parse (the metadata is not what datasets wrote)."""
    try:
        return datasets.Features.from_arrow_schema(schema).to_dict()
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(f"shard {path} declares `datasets` features that do not parse (its `huggingface` schema "
                         f"metadata: {type(exc).__name__}: {str(exc)[:120]}); re-run the rollout that wrote it",
                         shard=str(path)) from None


def _check_name(name: str) -> str:
    return check_name(name, "run name")  # the run becomes a config and a folder of the repo


def _repo_index(backend: HubBackend, repo: str, name: str) -> tuple[dict, str]:
    """The run's index.json at the head (empty for a new run: what an earlier, maybe interrupted, push left),
    and the head's commit id."""
    snapshot = backend.resolve(repo, patterns=[f"{name}/{INDEX_FILE}", GITATTRIBUTES])  # (one file always matches)
    path = snapshot.path / name / INDEX_FILE
    index = read_index(StoredFile(path, f"{repo}:{name}/{INDEX_FILE}", INDEX_FIX)) if path.exists() else {}
    return {"shards": dict(index.get("shards") or {}), "features": index.get("features")}, snapshot.revision


def _batches(files: list[Path], batch_bytes: int) -> list[list[Path]]:
    """Consecutive groups of about `batch_bytes` (at least one file each): one commit each."""
    out: list[list[Path]] = []
    size = 0
    for path in files:
        if not out or size + path.stat().st_size > batch_bytes:
            out.append([])
            size = 0
        out[-1].append(path)
        size += path.stat().st_size
    return out


def _finish(backend: HubBackend, repo: str, name: str, index: dict, shards: list[Path],
            manifests: list[Path], head: str) -> tuple[str, int]:
    """The last commit: manifests, index, summary and the card (none if nothing changed). If another push
    changed the runs meanwhile, the card is rebuilt (at most twice more) so it lists every run in the repo.
    Returns the revision and the number of commits made."""
    loaded = [read_run_manifest(m) for m in manifests]
    files: dict[str, Any] = {f"{name}/{m.name}": m for m in manifests}
    files[f"{name}/{INDEX_FILE}"] = _index_json(index)
    commits = 0
    for _ in range(3):
        runs = _runs(backend, repo)
        summary = merge_summaries(runs.get(name, ({}, None))[1], run_summary(shards, loaded))
        runs[name] = (index, summary)
        files[f"{name}/{SUMMARY_FILE}"] = _json(summary)
        files["README.md"] = render_card(repo, runs).encode()
        revision = backend.commit(repo, files, f"Run {name}: {sum(s['rows'] for s in index['shards'].values())} "
                                               f"rollouts")
        commits += revision != head
        if set(_runs(backend, repo, revision)) == set(runs):
            break
        files, head = {}, revision  # someone else's run landed meanwhile: only the card needs redoing
    return revision, commits


def _runs(backend: HubBackend, repo: str, revision: str | None = None) -> dict[str, tuple[dict, dict | None]]:
    """{run: (index.json, summary.json)} of every run in the repo (metadata files only)."""
    snapshot = backend.resolve(repo, revision, patterns=[f"*/{INDEX_FILE}", f"*/{SUMMARY_FILE}", GITATTRIBUTES])
    out = {}
    for path in snapshot.path.glob(f"*/{INDEX_FILE}"):
        summary = path.parent / SUMMARY_FILE
        at = f"{repo}@{snapshot.revision}:{path.parent.name}/"
        out[path.parent.name] = (read_index(StoredFile(path, at + INDEX_FILE, INDEX_FIX)),
                                 read_summary(StoredFile(summary, at + SUMMARY_FILE, INDEX_FIX))
                                 if summary.exists() else None)
    return out


def _progress(batches: list[list[Path]], total: int, name: str, enabled: bool):
    """Yield the batches, with a rich progress bar of shards uploaded when enabled."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"[bold]push {name}"), BarColumn(), MofNCompleteColumn(), TextColumn("shards"),
                  TimeElapsedColumn(), disable=not enabled) as bar:
        task = bar.add_task("push", total=total)
        for batch in batches:
            yield batch
            bar.update(task, advance=len(batch))


def _index_json(index: dict) -> bytes:
    """index.json: shards sorted by name, features in column order (their order is the dataset's)."""
    shards = dict(sorted(index["shards"].items()))
    return json.dumps({"rows": sum(s["rows"] for s in shards.values()), "shards": shards,
                       "features": index["features"]}, indent=1).encode()


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True).encode()
