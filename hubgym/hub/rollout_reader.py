"""Read stored rollouts back, from a run folder, shard files or a hub ref, verified shard by shard.

    for row in iter_rollouts("org/rollouts@3f1c2e9:r1", hub="hf"): ...   # dicts, streamed from the Hub
    for batch in iter_batches("runs/r1"): ...                            # pyarrow RecordBatches
    ds = open_rollouts("org/rollouts:r1")                                # a datasets IterableDataset
    ds = open_rollouts("runs/r1", streaming=False)                       # a datasets Dataset

A source is a run folder (or any folder of shards), a shard file, a hub ref `org/name[@revision][:RUN]`
(every run of the repo when RUN is left out), or a list of these. A hub source reads only its runs'
index.json (rows and sha256 of every shard) before the first shard; shards then stream one at a time,
the next fetched while the current one is read, and each is checked whole before any of its rows is
handed out. A bad shard raises ShardError naming it; with `skip_bad=True` it is left out, the rest is
read, and one SkippedShardsWarning at the end counts and names what was skipped.
"""

from __future__ import annotations

import json
import os
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import datasets
import pyarrow as pa

from hubgym.errors import EnvNotFoundError, NoShardsError, ShardError, SkippedShardsWarning
from hubgym.hub.base import HubBackend, check_name, get_hub, parse_ref
from hubgym.hub.shards import LoadedShard, ShardSource, load_shard
from hubgym.schemas.rollouts import ROLLOUT_FEATURES
from hubgym.schemas.tasks import parse_json

Source = str | os.PathLike | Sequence[str | os.PathLike]
HubSpec = HubBackend | str | os.PathLike | None
INDEX_FILE = "index.json"
"""`<run>/index.json` in a rollout repo: {"shards": {file: {"sha256", "rows"}}, "features": ..., "rows": ...}."""


def parse_rollout_ref(ref: str) -> tuple[str, str | None, str | None]:
    """`org/name[@revision][:RUN]` -> (repo, revision, run)."""
    head, _, run = str(ref).partition(":")
    repo, revision = parse_ref(head)
    return repo, revision, check_name(run, "run name") if run else None


def shard_sources(source: Source, *, hub: HubSpec = None) -> list[ShardSource]:
    """Every shard of a source, with the sha256 and rows recorded for it (where something recorded them)."""
    return _collect(source, hub)[0]


def _collect(source: Source, hub: HubSpec) -> tuple[list[ShardSource], dict | None]:
    """(shards, the features a hub run recorded for them, if the first source is a hub run)."""
    if isinstance(source, (list, tuple)):
        parts = [_collect(one, hub) for one in source]
        return [s for shards, _ in parts for s in shards], parts[0][1] if parts else None
    path = Path(source)
    if path.exists():
        return _local_sources(path), None
    if "/" not in str(source) or str(source).startswith((".", "/", "~")):
        raise NoShardsError(f"{source} does not exist; give a run folder, shard files, or a hub ref "
                            f"org/name[@revision][:RUN]")
    try:
        return _hub_sources(str(source), get_hub(hub))
    except EnvNotFoundError as exc:
        raise NoShardsError(f"{source} is not a folder or file here, nor a rollout repo: {exc}") from None


def _local_sources(path: Path) -> list[ShardSource]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.arrow") if not p.name.startswith("."))
    if not files:
        raise NoShardsError(f"no rollout shards (*.arrow) under {path}; give a run folder written by "
                            f"`hubgym rollout` or its shard files")
    recorded: dict[Path, dict[str, dict]] = {}
    out = []
    for file in files:
        run_dir = file.parent.parent
        if run_dir not in recorded:
            recorded[run_dir] = recorded_shards(run_dir)
        info = recorded[run_dir].get(file.name, {})
        out.append(ShardSource(str(file), str(file), info.get("sha256"), info.get("rows")))
    return out


def recorded_shards(run_dir: Path) -> dict[str, dict]:
    """{shard file: {"sha256", "rows"}} from a run folder's manifests (writer) and index.json (push)."""
    found: dict[str, dict] = {}
    for manifest in sorted(run_dir.glob("manifest-*.json")):
        found.update(_read_json(manifest).get("shard_files") or {})
    if (run_dir / INDEX_FILE).is_file():
        found.update(_read_json(run_dir / INDEX_FILE).get("shards") or {})
    return found


def _hub_sources(ref: str, backend: HubBackend) -> tuple[list[ShardSource], dict | None]:
    repo, revision, run = parse_rollout_ref(ref)
    snapshot = backend.resolve(repo, revision, patterns=[f"{run or '*'}/{INDEX_FILE}"])  # metadata only
    runs = sorted(p.parent.name for p in snapshot.path.glob(f"*/{INDEX_FILE}"))
    if run is not None and run not in runs:
        raise NoShardsError(f"{repo}@{snapshot.revision} on the {backend.name} hub has no rollout run {run!r}; its "
                            f"runs: {', '.join(runs) or 'none'}. Push one with `hubgym push-rollouts RUN_DIR {repo}`")
    out, features = [], None
    for name in [run] if run else runs:
        index = _read_json(snapshot.path / name / INDEX_FILE)
        shards, features = index["shards"], features or index.get("features")
        paths = [f"{name}/shards/{file}" for file in sorted(shards)]
        urls, kwargs = backend.stream_urls(snapshot, paths)
        for path, url in zip(paths, urls, strict=True):
            protocol = url.split("://", 1)[0] if "://" in url else ""
            options = (kwargs.get("storage_options") or {}).get(protocol, {})
            info = shards[path.rsplit("/", 1)[1]]
            out.append(ShardSource(path, url, info["sha256"], info["rows"], options))
    if not out:
        raise NoShardsError(f"{repo}@{snapshot.revision} on the {backend.name} hub holds no rollout runs; push one "
                            f"with `hubgym push-rollouts RUN_DIR {repo}`")
    return out, features


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())


# -- iterating --------------------------------------------------------------------------------------


def iter_batches(source: Source, *, hub: HubSpec = None, verify: bool = True, skip_bad: bool = False,
                 counts: dict | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of every shard of `source`, in order, each shard checked before its first batch.

    `counts`, if given, gets "shards", "rows" and "bad_shards" added up as the read goes.
    """
    yield from _batches(shard_sources(source, hub=hub), verify, skip_bad, counts)


def iter_rollouts(source: Source, *, hub: HubSpec = None, verify: bool = True, skip_bad: bool = False,
                  counts: dict | None = None) -> Iterator[dict[str, Any]]:
    """Rollout rows as dicts (`info` decoded, as `datasets` decodes it), one record batch in memory at a time."""
    for batch in iter_batches(source, hub=hub, verify=verify, skip_bad=skip_bad, counts=counts):
        for row in batch.to_pylist():
            yield decode_row(row)


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    if isinstance(row.get("info"), str):
        row["info"] = parse_json(row["info"])
    return row


def _batches(sources: list[ShardSource], verify: bool, skip_bad: bool,
             counts: dict | None) -> Iterator[pa.RecordBatch]:
    counts = counts if counts is not None else {}
    bad: list[str] = []
    for source, loaded in _prefetched(sources, verify):
        if isinstance(loaded, ShardError):
            if not skip_bad:
                raise loaded
            bad.append(source.name)
            counts["bad_shards"] = counts.get("bad_shards", 0) + 1
            continue
        counts["shards"] = counts.get("shards", 0) + 1
        counts["rows"] = counts.get("rows", 0) + loaded.rows
        yield from loaded.batches()
    if bad:
        warnings.warn(SkippedShardsWarning(f"skipped {len(bad)} bad shard(s) (of {len(sources)} in this read): "
                                           f"{', '.join(bad)}"), stacklevel=3)


def _prefetched(sources: list[ShardSource], verify: bool) -> Iterator[tuple[ShardSource, LoadedShard | ShardError]]:
    """Each shard loaded and checked (or its ShardError), the next one loading in a thread meanwhile."""
    if not sources:
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="hubgym-shards")
    try:
        pending: Future = pool.submit(_load, sources[0], verify)
        for i, source in enumerate(sources):
            loaded = pending.result()
            if i + 1 < len(sources):
                pending = pool.submit(_load, sources[i + 1], verify)
            yield source, loaded
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _load(source: ShardSource, verify: bool) -> LoadedShard | ShardError:
    try:
        return load_shard(source, verify=verify)
    except ShardError as exc:
        return exc


# -- as a `datasets` dataset ------------------------------------------------------------------------


@dataclass
class RolloutShardsConfig(datasets.BuilderConfig):
    """The shards to read and how; the builder only hands verified batches to `datasets`."""

    sources: tuple[ShardSource, ...] = ()
    rollout_features: datasets.Features | None = None
    verify: bool = True
    skip_bad: bool = False


class RolloutShards(datasets.ArrowBasedBuilder):
    """Rollout shards as a `datasets` builder: streaming, sharding across DataLoader workers and nodes,
    and the Dataset API, over the same verified reading as `iter_batches`."""

    BUILDER_CONFIG_CLASS = RolloutShardsConfig

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(features=self.config.rollout_features)

    def _split_generators(self, dl_manager):
        return [datasets.SplitGenerator(name=datasets.Split.TRAIN, gen_kwargs={"sources": list(self.config.sources)})]

    def _generate_tables(self, sources: list[ShardSource]):
        from datasets.builder import Key

        columns = list(self.config.rollout_features)
        for i, batch in enumerate(_batches(sources, self.config.verify, self.config.skip_bad, None)):
            missing = [c for c in columns if c not in batch.schema.names]
            if missing:
                raise ShardError(f"a shard lacks column(s) {', '.join(missing)} that the first shard has; open runs "
                                 f"with different columns (e.g. re-scored and not) separately")
            yield Key(0, i), pa.Table.from_batches([batch]).select(columns)


def open_rollouts(source: Source, *, hub: HubSpec = None, streaming: bool = True, verify: bool = True,
                  skip_bad: bool = False, cache_dir: str | os.PathLike | None = None):
    """The rollouts of `source` as a `datasets.IterableDataset` (streaming) or a `datasets.Dataset`.

    Not streaming, the verified rows are written once into the `datasets` cache (`cache_dir`).
    """
    sources, stored = _collect(source, hub)
    if not sources:
        raise NoShardsError(f"no rollout shards in {source}")
    features = datasets.Features.from_dict(stored) if stored else _local_features(sources)
    recorded = all(s.sha256 for s in sources)  # content-addressed: a cache built from them stays valid
    config_name = "rollouts-" + datasets.fingerprint.Hasher.hash([(s.location, s.sha256) for s in sources])[:16]
    builder = RolloutShards(cache_dir=str(cache_dir) if cache_dir else None, dataset_name="hubgym_rollouts",
                            config_name=config_name, hash=config_name, sources=tuple(sources),
                            rollout_features=features, verify=verify, skip_bad=skip_bad)
    if streaming:
        return builder.as_streaming_dataset(split="train")
    builder.download_and_prepare(download_mode=None if recorded else datasets.DownloadMode.FORCE_REDOWNLOAD)
    return builder.as_dataset(split="train")


def _local_features(sources: list[ShardSource]) -> datasets.Features:
    """The features of the first local shard that opens (hub runs record theirs in index.json)."""
    for s in sources:
        try:
            with pa.memory_map(s.location) as f:
                return datasets.Features.from_arrow_schema(pa.ipc.open_file(f).schema)
        except (pa.ArrowInvalid, OSError):
            continue
    return ROLLOUT_FEATURES
