"""The env manifest (`hubgym.json`): what a pushed env repo holds, written by push and checked by load.

    {"format": "hubgym-env", "schema_version": "1.0", "hubgym_version": "0.1.0",
     "env": "arithmetic", "env_version": 1, "env_id": "arithmetic-v1", "kind": "single_turn",
     "tools": [],                                   # every tool any row offers
     "verifier": {"path": "verifier.py", "module": "hubgym.verifiers.arithmetic", "sha256": "...",
                  "rewards": {"correct": 1.0, "formatted": 0.0}, "reward_range": [0.0, 1.0],
                  "success_threshold": 1.0, "multi_turn": false},
     "tools_module": {"path": "tools.py", "module": "...", "sha256": "..."},  # or null: the env's own tools
     "code": {"files": {"verifier.py": "...", "tools.py": "..."}, "sha256": "..."},   # what a pin names
     "golden": "golden.jsonl",                      # or null
     "interaction": {...},                          # the interaction spec of the first row (the default)
     "default_config": "easy",
     "configs": {"easy": {"params": {"seed": 0, "sizes": {...}, ...}, "kinds": ["single_turn"],
                          "splits": {"test": {"num_rows": 30, "files": ["data/easy/test-00000-of-00001.parquet"]}}}}}

It carries no timestamp, so pushing the same env twice changes nothing and makes no new revision.

The JSON files beside rollout shards are read here too: a run's `manifest-*.json` and a rollout repo's
`index.json` (read_run_manifest, read_index). Every stored JSON file is data from someone else: it is
read as UTF-8 JSON and each field hubgym uses is type-checked before use, so a bad file is one error
naming it (EnvContractError for hubgym.json, ManifestError for the others), never a KeyError.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from hubgym.errors import EnvContractError, EnvNotFoundError, ManifestError, Where
from hubgym.files import read_small_file
from hubgym.schemas.version import SCHEMA_VERSION

FORMAT = "hubgym-env"
MANIFEST_FILE = "hubgym.json"
VERIFIER_FILE = "verifier.py"
TOOLS_FILE = "tools.py"
GOLDEN_FILE = "golden.jsonl"
CARD_FILE = "README.md"
METADATA_FILES = [MANIFEST_FILE, VERIFIER_FILE, TOOLS_FILE, GOLDEN_FILE, CARD_FILE]
"""The small files of an env repo: what a streaming load downloads (the data files are read remotely)."""

REQUIRED = ("format", "schema_version", "env", "env_version", "verifier", "default_config", "configs")
MAX_STORED_JSON_BYTES = 64 << 20
"""64 MiB: a manifest or index.json lists shards (about 150 bytes each); a file past it is not one, and is not read
whole (nor is a FIFO or a device in its place)."""


def data_path(config: str, split: str, shard: int, shards: int) -> str:
    """`data/<config>/<split>-00000-of-00001.parquet`: the Hub's shard naming."""
    return f"data/{config}/{split}-{shard:05d}-of-{shards:05d}.parquet"


def dumps(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()  # insertion order: splits as built


def read_manifest(folder: Path, ref: str) -> dict[str, Any]:
    """Read and check a snapshot's manifest; every problem names the repo and says how to fix it."""
    path = folder / MANIFEST_FILE
    if not path.exists():
        raise EnvContractError(f"repo {ref} has no {MANIFEST_FILE}, so it is not a hubgym env (or was pushed "
                               f"by something else)", Where(env=ref, field=MANIFEST_FILE), f"push the env with "
                               f"`hubgym push ENV REPO`, which writes {MANIFEST_FILE}; plain task data loads with "
                               f"datasets.load_dataset")

    def fail(problem: str, field: str | None = None) -> EnvContractError:
        return EnvContractError(f"{MANIFEST_FILE} of {ref} {problem}", Where(env=ref, field=field or MANIFEST_FILE),
                                "re-push the env with `hubgym push`")

    manifest = read_json_object(path, fail)
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise fail(f"lacks {missing}", missing[0])
    if manifest["format"] != FORMAT:
        raise EnvContractError(f"{MANIFEST_FILE} of {ref} has format {manifest['format']!r:.80}, not {FORMAT!r}",
                               Where(env=ref, field="format"), "load it with the tool that wrote it")
    _check_types(manifest, fail)
    _check_schema_version(manifest["schema_version"], ref)
    _check_paths(manifest, ref)
    return manifest


def _check_types(manifest: dict, fail: Callable[..., Exception]) -> None:
    """Every field a load reads has the JSON type push writes (a manifest is data from someone else)."""
    for key, kinds in _TYPES.items():
        if key in manifest:
            expect(manifest[key], kinds, key, fail)
    for key, kinds in _VERIFIER_TYPES.items():
        expect(manifest["verifier"].get(key), kinds, f"verifier.{key}", fail)
    if manifest.get("tools_module") is not None:
        for key, kinds in _VERIFIER_TYPES.items():
            expect(manifest["tools_module"].get(key), kinds, f"tools_module.{key}", fail)
    if "code" in manifest:
        expect(manifest["code"].get("sha256"), (str,), "code.sha256", fail)
        for path, sha in expect(manifest["code"].get("files"), (dict,), "code.files", fail).items():
            expect(sha, (str,), f"code.files[{path!r:.80}]", fail)
    for name, config in manifest["configs"].items():
        at = f"configs.{name}"
        splits = expect(expect(config, (dict,), at, fail).get("splits"), (dict,), f"{at}.splits", fail)
        for split, info in splits.items():
            files = expect(expect(info, (dict,), f"{at}.{split}", fail).get("files"), (list,), f"{at}.{split}.files",
                           fail)
            for i, file in enumerate(files):
                expect(file, (str,), f"{at}.{split}.files[{i}]", fail)
    if manifest["default_config"] not in manifest["configs"]:
        raise fail(f"names default_config {manifest['default_config']!r:.80}, which is none of its configs",
                   "default_config")


def _check_schema_version(version: str, ref: str) -> None:
    if str(version).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise EnvContractError(f"{MANIFEST_FILE} of {ref} records task schema {version!r:.40}; this hubgym reads "
                               f"schema {SCHEMA_VERSION}",
                               Where(env=ref, field="schema_version"),
                               "install the hubgym version that matches the repo, or re-push the env with this one")


def _check_paths(manifest: dict, ref: str) -> None:
    """Paths in a manifest stay inside the repo: a manifest is data from someone else."""
    paths = [manifest["verifier"]["path"]] + [manifest["golden"]] * bool(manifest.get("golden"))
    paths += [manifest["tools_module"]["path"]] if manifest.get("tools_module") else []
    paths += [f for c in manifest["configs"].values() for s in c["splits"].values() for f in s["files"]]
    for p in paths:
        parts = PurePosixPath(p).parts
        if not p or p.startswith("/") or "\\" in p or ".." in parts:
            raise EnvContractError(f"{MANIFEST_FILE} of {ref} names the path {p!r}, outside the repo",
                                   Where(env=ref, field=MANIFEST_FILE), "re-push the env with `hubgym push`")


def config_files(manifest: dict, ref: str, config: str | None, split: str | None) -> tuple[str, dict[str, list[str]]]:
    """(config name, {split: data files}) for a load; unknown configs and splits list the known ones."""
    config = config or manifest["default_config"]
    configs = manifest["configs"]
    if config not in configs:
        raise EnvNotFoundError(f"repo {ref} has no config {config!r}; it has {', '.join(configs)}")
    splits = {s: v["files"] for s, v in configs[config]["splits"].items()}
    if split is not None and split not in splits:
        raise EnvNotFoundError(f"config {config!r} of repo {ref} has no split {split!r}; it has {', '.join(splits)}")
    return config, splits if split is None else {split: splits[split]}


# -- the JSON files of rollout runs: manifest-*.json (writer, re-scoring), index.json (push) -----------

RUN_MANIFEST_FIX = ("restore it from a copy (a pushed run holds it as RUN/manifest-*.json), or delete it: the shards "
                    "are then checked without a recorded sha256 (every batch is fully validated either way)")
INDEX_FIX = "push the run again (`hubgym push-rollouts RUN_DIR REPO` rewrites index.json)"
_SHARD_FILE = re.compile(r"[A-Za-z0-9][\w.-]*\.arrow")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class StoredFile:
    """A stored JSON file, and how its problems are raised: ManifestError naming the file, with the fix."""

    path: Path
    name: str  # how messages name it: a path, or org/name@<commit>:RUN/index.json
    fix: str

    def fail(self, problem: str, field: str | None = None) -> ManifestError:
        return ManifestError(f"{self.name} {problem}; {self.fix}", path=self.name)

    def read(self) -> dict[str, Any]:
        return read_json_object(self.path, self.fail)


_RUN_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str, type(None)), "schema_version": (str,), "worker": (str,), "model": (str,), "kind": (str,),
    "policy_version": (int,), "n": (int,), "rows": (int,), "shards": (list,), "split": (str, type(None)),
    "engine": (str,), "updated_at": (str,), "run_ids": (list,)}
"""The JSON type of each field a run manifest's writers write (the rollout run, a re-score, an import); a field
left out is fine (older runs, online steps), one of another type is not."""
_COUNTS = ("policy_version", "n", "rows")


def read_run_manifest(path: Path) -> dict[str, Any]:
    """A run folder's manifest-*.json: every field its writers write of its type (`_RUN_TYPES`), counts >= 0,
    `envs` and `shard_files` (always a dict) checked, and `rows` equal to the rows its shard records add up to."""
    stored = StoredFile(path, str(path), RUN_MANIFEST_FIX)
    manifest = stored.read()
    for key, kinds in _RUN_TYPES.items():
        if key in manifest or key == "run_id":
            expect(manifest.get(key), kinds, key, stored.fail)
    for key in _COUNTS:
        if key in manifest and manifest[key] < 0:
            raise stored.fail(f"has {key} {manifest[key]}, expected a count >= 0", key)
    for key in ("shards", "run_ids"):
        for i, value in enumerate(manifest.get(key) or []):
            expect(value, (str,), f"{key}[{i}]", stored.fail)
    for env, info in (expect(manifest.get("envs"), (dict, type(None)), "envs", stored.fail) or {}).items():
        expect(info, (dict,), f"envs.{env}", stored.fail)
    files = expect(manifest.get("shard_files"), (dict, type(None)), "shard_files", stored.fail) or {}
    manifest["shard_files"] = shard_records(files, "shard_files", stored.fail)
    _check_rows(manifest, "shard_files", stored)
    return manifest


def _check_rows(record: dict[str, Any], field: str, stored: StoredFile) -> None:
    """A record's `rows` (where it has one and lists shards) is what its shards' rows add up to."""
    if "rows" in record and record.get(field):
        total = sum(info["rows"] for info in record[field].values())
        if record["rows"] != total:
            raise stored.fail(f"has rows {record['rows']}, but the rows of its {field} add up to {total}", "rows")


def run_ids(manifest: dict[str, Any]) -> frozenset[str] | None:
    """The run ids a run manifest says its rows hold: a rollout run's own; a re-score's `run_ids` (the runs it
    re-scored). None where it does not say (an older re-score): its rows' run ids are not checked then."""
    if manifest.get("kind") == "rescore":
        return frozenset(manifest["run_ids"]) if "run_ids" in manifest else None
    return frozenset([manifest["run_id"]]) if manifest.get("run_id") is not None else None


def read_index(stored: StoredFile) -> dict[str, Any]:
    """A rollout run's index.json: `shards` checked, `features` (if any) a valid `datasets` features dict."""
    index = stored.read()
    index["shards"] = shard_records(expect(index.get("shards"), (dict,), "shards", stored.fail), "shards", stored.fail)
    if "rows" in index:
        expect(index["rows"], (int,), "rows", stored.fail)
        _check_rows(index, "shards", stored)
    features = expect(index.get("features"), (dict, type(None)), "features", stored.fail)
    if features:
        import datasets

        try:
            datasets.Features.from_dict(features).arrow_schema  # noqa: B018  (the types must be buildable)
        except Exception as exc:  # whatever a hand-made dict trips in datasets' decoding
            raise stored.fail(f"has features that are not `datasets` features ({type(exc).__name__}: "
                              f"{str(exc)[:120]})", "features") from None
    return index


def shard_records(files: dict, field: str, fail: Callable[..., Exception]) -> dict[str, dict[str, Any]]:
    """{shard file: {"sha256": 64 hex digits, "rows": int >= 0}}, each entry checked (a file name, not a path)."""
    for file, info in files.items():
        at = f"{field}[{file!r:.80}]"
        if not _SHARD_FILE.fullmatch(file):
            raise fail(f"lists {file!r:.80} in {field}, which is not a shard file name (<worker>-<n>.arrow)", field)
        info = expect(info, (dict,), at, fail)
        if not (isinstance(info.get("sha256"), str) and _SHA256.fullmatch(info["sha256"])):
            raise fail(f"has {at}.sha256 {info.get('sha256')!r:.80}, expected 64 lowercase hex digits", field)
        if expect(info.get("rows"), (int,), f"{at}.rows", fail) < 0:
            raise fail(f"has {at}.rows {info['rows']}, expected a count >= 0", field)
    return files


# -- stored JSON, whoever wrote it ------------------------------------------------------------------


def read_json_object(path: Path, fail: Callable[..., Exception]) -> dict[str, Any]:
    """The JSON object stored in `path`; else `fail(problem)` is raised, the problem said in a few words
    (unreadable, e.g. a folder; not UTF-8; not JSON, e.g. truncated; a number past Python's digit limit or
    nesting past its recursion limit; JSON, but not an object)."""
    try:  # a regular file of bounded size: a FIFO or a device in its place is refused, never waited on
        data = read_small_file(path, MAX_STORED_JSON_BYTES)
    except (OSError, ValueError) as exc:
        detail = f"{type(exc).__name__}: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
        raise fail(f"cannot be read ({detail})") from None
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise fail(f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise fail(f"is not valid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(value, dict):
        raise fail(f"holds {json_kind(value)}, not a JSON object")
    return value


def expect(value: Any, kinds: tuple[type, ...], field: str, fail: Callable[..., Exception]) -> Any:
    """`value`, if it has one of the JSON types `kinds` (a boolean is no integer); else `fail(problem, field)`."""
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise fail(f"has {field} as {json_kind(value)}, expected {' or '.join(_JSON_NAMES[k] for k in kinds)}", field)
    return value


def json_kind(value: Any) -> str:
    """How JSON names the type of a decoded value: 'a string', 'null', ..."""
    for kind, name in _JSON_NAMES.items():
        if isinstance(value, kind):
            return "null" if value is None else f"{'an' if name[0] in 'aeio' else 'a'} {name}"
    return type(value).__name__


_JSON_NAMES: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
                                dict: "object", type(None): "null"}
_TYPES: dict[str, tuple[type, ...]] = {
    "format": (str,), "schema_version": (str,), "env": (str,), "env_version": (int,), "verifier": (dict,),
    "golden": (str, type(None)), "default_config": (str,), "configs": (dict,), "tools": (list,), "kind": (str,),
    "tools_module": (dict, type(None)), "code": (dict,)}
_VERIFIER_TYPES: dict[str, tuple[type, ...]] = {"path": (str,), "sha256": (str,), "module": (str, type(None))}
