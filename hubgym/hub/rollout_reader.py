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

import os
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import datasets
import pyarrow as pa
from datasets.exceptions import DatasetGenerationError

from hubgym.errors import EnvNotFoundError, HubgymError, NoShardsError, ShardError
from hubgym.hub.base import HubBackend, check_name, parse_ref
from hubgym.hub.factory import get_hub
from hubgym.hub.manifest import INDEX_FIX, StoredFile, read_index, read_run_manifest, run_ids
from hubgym.hub.shard_checks import SeenRollouts
from hubgym.hub.shards import (
    LoadedShard, ShardSource, decode_info, fetch_or_error, open_or_error, shard_rows, skipped_warning,
)
from hubgym.schemas.rollouts import ROLLOUT_FEATURES, upgrade_schema

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
    """Every shard of a source, with the sha256 and rows recorded for it (where something recorded them); a shard
    that two of the sources hold (a run given twice) once."""
    return _collect(source, hub)[0]


def _collect(source: Source, hub: HubSpec) -> tuple[list[ShardSource], dict | None]:
    """(shards, the features a hub run recorded for them, if the first source is a hub run)."""
    if isinstance(source, (list, tuple)):
        parts = [_collect(one, hub) for one in source]
        shards = {_where(s): s for shards, _ in parts for s in shards}  # a file read once (dicts keep their order)
        return list(shards.values()), parts[0][1] if parts else None
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


def _where(shard: ShardSource) -> str:
    """What tells two shard files apart: a URL, or a local file's real path."""
    return shard.location if shard.remote else os.path.realpath(shard.location)


def local_shard_sources(paths: Sequence[str | os.PathLike]) -> list[ShardSource]:
    """The shards of local run folders and shard files (never a hub ref: a missing path is NoShardsError)."""
    for path in map(Path, paths):
        if not path.exists():
            raise NoShardsError(f"{path} does not exist; give a run folder written by `hubgym rollout` or its "
                                f"shard files")
    return list({_where(s): s for path in paths for s in _local_sources(Path(path))}.values())


def _local_sources(path: Path) -> list[ShardSource]:
    """A shard file, or every shard of the runs under a folder: those found and those a run manifest records
    (one that is gone is read as missing, so the read fails naming it instead of quietly holding fewer rows)."""
    found = [path] if path.is_file() else [p for p in path.rglob("*.arrow") if not p.name.startswith(".")]
    run_dirs = {file.parent.parent for file in found}
    if not path.is_file():
        run_dirs |= {manifest.parent for manifest in path.rglob("manifest-*.json")}
    recorded = {run_dir: recorded_shards(run_dir) for run_dir in sorted(run_dirs)}
    owners = {run_dir: recorded_run_ids(run_dir) for run_dir in sorted(run_dirs)}
    listed = {run_dir / "shards" / name for run_dir, files in recorded.items() for name in files}
    files = sorted(set(found) | {p for p in listed if path in p.parents}) if not path.is_file() else found
    if not files:
        raise NoShardsError(f"no rollout shards (*.arrow) under {path}; give a run folder written by "
                            f"`hubgym rollout` or its shard files")
    out = []
    for file in files:
        info = recorded[file.parent.parent].get(file.name, {})
        ids = owners[file.parent.parent].get(shard_worker(file.name))
        out.append(ShardSource(str(file), str(file), info.get("sha256"), info.get("rows"), run_ids=ids))
    return out


def recorded_shards(run_dir: Path) -> dict[str, dict]:
    """{shard file: {"sha256", "rows"}} from a run folder's manifests (writer) and index.json (push); a manifest
    or index that is not what hubgym writes is ManifestError naming it."""
    found: dict[str, dict] = {}
    for manifest in sorted(run_dir.glob("manifest-*.json")):
        found.update(read_run_manifest(manifest)["shard_files"])
    index = run_dir / INDEX_FILE
    if index.exists():
        found.update(read_index(StoredFile(index, str(index), INDEX_FIX))["shards"])
    return found


def recorded_run_ids(run_dir: Path) -> dict[str, frozenset[str] | None]:
    """{worker: the run ids its manifest says its shards' rows hold} (manifest-<worker>.json names the worker, its
    shards are <worker>-<n>.arrow); a worker without a manifest, or whose manifest does not say, is not listed."""
    owners: dict[str, frozenset[str] | None] = {}
    for manifest in sorted(run_dir.glob("manifest-*.json")):
        owners[manifest.stem.removeprefix("manifest-")] = run_ids(read_run_manifest(manifest))
    return owners


def shard_worker(file: str) -> str:
    """The worker that wrote a shard file: `w000of001` of `w000of001-00003.arrow`."""
    return file.rsplit("-", 1)[0]


def _hub_sources(ref: str, backend: HubBackend) -> tuple[list[ShardSource], dict | None]:
    repo, revision, run = parse_rollout_ref(ref)
    patterns = [f"{run or '*'}/{INDEX_FILE}", f"{run or '*'}/manifest-*.json"]  # metadata only
    snapshot = backend.resolve(repo, revision, patterns=patterns)
    runs = sorted(p.parent.name for p in snapshot.path.glob(f"*/{INDEX_FILE}"))
    if run is not None and run not in runs:
        raise NoShardsError(f"{repo}@{snapshot.revision} on the {backend.name} hub has no rollout run {run!r}; its "
                            f"runs: {', '.join(runs) or 'none'}. Push one with `hubgym push-rollouts RUN_DIR {repo}`")
    out, features = [], None
    for name in [run] if run else runs:
        stored = StoredFile(snapshot.path / name / INDEX_FILE, f"{repo}@{snapshot.revision}:{name}/{INDEX_FILE}",
                            INDEX_FIX)
        index = read_index(stored)
        owners = recorded_run_ids(snapshot.path / name)
        shards, features = index["shards"], features or index.get("features")
        paths = [f"{name}/shards/{file}" for file in sorted(shards)]
        urls, kwargs = backend.stream_urls(snapshot, paths)
        for path, url in zip(paths, urls, strict=True):
            protocol = url.split("://", 1)[0] if "://" in url else ""
            options = (kwargs.get("storage_options") or {}).get(protocol, {})
            info = shards[path.rsplit("/", 1)[1]]
            out.append(ShardSource(path, url, info["sha256"], info["rows"], options,
                                   run_ids=owners.get(shard_worker(path.rsplit("/", 1)[1]))))
    if not out:
        raise NoShardsError(f"{repo}@{snapshot.revision} on the {backend.name} hub holds no rollout runs; push one "
                            f"with `hubgym push-rollouts RUN_DIR {repo}`")
    return out, features


# -- iterating --------------------------------------------------------------------------------------


def iter_batches(source: Source, *, hub: HubSpec = None, verify: bool = True, skip_bad: bool = False,
                 counts: dict | None = None, vocab_size: int | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of every shard of `source`, in order, each shard checked before its first batch.

    `counts`, if given, gets "shards", "rows", "bad_shards" and "bad_rows" added up as the read goes;
    `vocab_size`: token ids are held below it too (the reader knows the tokenizer).
    """
    for loaded in verified_shards(shard_sources(source, hub=hub), verify=verify, skip_bad=skip_bad, counts=counts,
                                  vocab_size=vocab_size):
        yield from loaded.batches()


def iter_rollouts(source: Source, *, hub: HubSpec = None, verify: bool = True, skip_bad: bool = False,
                  counts: dict | None = None, vocab_size: int | None = None) -> Iterator[dict[str, Any]]:
    """Rollout rows as dicts (`info` decoded, as `datasets` decodes it), one record batch in memory at a time."""
    for loaded in verified_shards(shard_sources(source, hub=hub), verify=verify, skip_bad=skip_bad, counts=counts,
                                  vocab_size=vocab_size):
        for batch in loaded.batches():
            for row in batch.to_pylist():
                yield decode_row(row, loaded.source.name)


def decode_row(row: dict[str, Any], shard: str | None = None) -> dict[str, Any]:
    if isinstance(row.get("info"), str):
        row["info"] = decode_info(row["info"], shard, row.get("rollout_id"))
    return row


def verified_shards(sources: list[ShardSource], *, verify: bool = True, skip_bad: bool = False,
                    counts: dict | None = None, whole_read: bool = True,
                    seen: SeenRollouts | None = None, vocab_size: int | None = None) -> Iterator[LoadedShard]:
    """Each shard loaded and checked (see load_shard: the row contract included), in order; a bad one raises its
    ShardError, or with `skip_bad` is left out, its rows counted, and named with what broke in one
    SkippedShardsWarning at the end (NoShardsError when every one is and `sources` is the `whole_read`, not one
    worker's part of it). This is the one way hubgym reads stored shards: iter_rollouts, open_rollouts, `hubgym
    report`, `score`, `replay`, `stats` and `view` all go through it. A shard holding a rollout id that an earlier
    one of the read held (or of `seen`'s reads) is a bad shard too."""
    counts = counts if counts is not None else {}
    bad: list[tuple[ShardSource, ShardError]] = []
    seen = seen if seen is not None else SeenRollouts()
    for source, loaded in _prefetched(sources, verify, vocab_size):
        if verify and isinstance(loaded, LoadedShard):
            try:
                seen.add(loaded.source.name, loaded.ids)
            except ShardError as exc:
                loaded = exc
        if isinstance(loaded, ShardError):
            if not skip_bad:
                raise loaded
            bad.append((source, loaded))
            counts["bad_shards"] = counts.get("bad_shards", 0) + 1
            if (rows := shard_rows(source)) is not None:  # as far as it is known (recorded, or the footer's)
                counts["bad_rows"] = counts.get("bad_rows", 0) + rows
            continue
        counts["shards"] = counts.get("shards", 0) + 1
        counts["rows"] = counts.get("rows", 0) + loaded.rows
        yield loaded
    if bad:
        warnings.warn(skipped_warning([(s.name, shard_rows(s), e) for s, e in bad], len(sources)), stacklevel=3)
        if whole_read and len(bad) == len(sources):  # skipping every shard would read nothing, looking like success
            raise NoShardsError(f"every one of the {len(sources)} shard(s) read is bad (named in the note above); "
                                f"re-run the rollout that wrote them, or read another source")


def _prefetched(sources: list[ShardSource], verify: bool,
                vocab_size: int | None = None) -> Iterator[tuple[ShardSource, LoadedShard | ShardError]]:
    """Each shard loaded and checked (or its ShardError), the next one read and hashed in a thread meanwhile
    (`fetch_shard`: outside the GIL nearly all of it); each is opened and checked here, as it is used."""
    if not sources:
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="hubgym-shards")
    try:
        pending: Future = pool.submit(fetch_or_error, sources[0])
        for i, source in enumerate(sources):
            fetched = pending.result()
            if i + 1 < len(sources):
                pending = pool.submit(fetch_or_error, sources[i + 1])
            yield source, open_or_error(fetched, verify=verify, vocab_size=vocab_size)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


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

        expected = self.config.rollout_features.arrow_schema
        i = 0
        # datasets hands each call a part of the shards (one per worker or stream shard): not the whole read; the
        # rollout ids seen are the builder's, so a rollout two shards hold is refused within a process
        self._seen = getattr(self, "_seen", None) or SeenRollouts()
        for loaded in verified_shards(sources, verify=self.config.verify, skip_bad=self.config.skip_bad,
                                      whole_read=False, seen=self._seen):
            _check_features(loaded, expected)
            for batch in loaded.batches():
                yield Key(0, i), pa.Table.from_batches([batch]).select(expected.names)
                i += 1


def _check_features(loaded: LoadedShard, expected: pa.Schema) -> None:
    """A shard holds every column of the dataset's features, typed as they type it."""
    schema = upgrade_schema(loaded.reader.schema)  # as its batches are read
    missing = [n for n in expected.names if n not in schema.names]
    other = [n for n in expected.names if n in schema.names and not schema.field(n).type.equals(expected.field(n).type)]
    if missing or other:
        raise ShardError(f"shard {loaded.source.name} does not fit the features of the first shard or of its run's "
                         f"index.json (missing: {', '.join(missing) or '-'}; other types: {', '.join(other) or '-'}); "
                         f"open runs with different columns (e.g. re-scored and not) separately, or push a run whose "
                         f"index.json was edited again", shard=loaded.source.name)


def open_rollouts(source: Source, *, hub: HubSpec = None, streaming: bool = True, verify: bool = True,
                  skip_bad: bool = False, cache_dir: str | os.PathLike | None = None):
    """The rollouts of `source` as a `datasets.IterableDataset` (streaming) or a `datasets.Dataset`.

    Not streaming, the verified rows are written once into the `datasets` cache (`cache_dir`).
    """
    sources, stored = _collect(source, hub)
    if not sources:
        raise NoShardsError(f"no rollout shards in {source}")
    features = datasets.Features.from_dict(stored) if stored else _local_features(sources)
    if "completion" in features:  # an older run's completion messages read with today's `reasoning` field
        features["completion"] = ROLLOUT_FEATURES["completion"]
    recorded = all(s.sha256 for s in sources)  # content-addressed: a cache built from them stays valid
    config_name = "rollouts-" + datasets.fingerprint.Hasher.hash([(s.location, s.sha256) for s in sources])[:16]
    builder = RolloutShards(cache_dir=str(cache_dir) if cache_dir else None, dataset_name="hubgym_rollouts",
                            config_name=config_name, hash=config_name, sources=tuple(sources),
                            rollout_features=features, verify=verify, skip_bad=skip_bad)
    if streaming:
        return builder.as_streaming_dataset(split="train")
    try:
        builder.download_and_prepare(download_mode=None if recorded else datasets.DownloadMode.FORCE_REDOWNLOAD)
    except DatasetGenerationError as exc:  # datasets wraps what the builder raised: hand back hubgym's own error
        if isinstance(exc.__cause__, HubgymError):
            raise exc.__cause__ from None
        raise
    return builder.as_dataset(split="train")


def _local_features(sources: list[ShardSource]) -> datasets.Features:
    """The features of the first local shard that opens (hub runs record theirs in index.json)."""
    for s in sources:
        try:
            with pa.memory_map(s.location) as f:
                return datasets.Features.from_arrow_schema(pa.ipc.open_file(f).schema)
        except (pa.ArrowException, OSError):  # a bad shard: the read names it when it gets there
            continue
        except (ValueError, KeyError, TypeError):  # its `huggingface` schema metadata is not what datasets wrote
            break
    return ROLLOUT_FEATURES
