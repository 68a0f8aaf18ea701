"""Every reader of stored data against damaged files: each case is read fine or ends in hubgym's named error
naming the file (ShardError for shards, ManifestError for a run's manifest-*.json and a rollout repo's index.json
and summary.json, EnvContractError for an env's hubgym.json), never a KeyError, TypeError, ArrowInvalid,
JSONDecodeError or UnicodeDecodeError; with skip_bad the other shards stay readable.

The files are real: a run written by ShardWriter, pushed with push_rollouts, and an env pushed with push_env,
all to a local hub folder. The damage: truncation, bit flips, wrong JSON types at every field, wrong Arrow
types, a missing column, latin-1 / invalid UTF-8 / UTF-16 text, empty files, a folder where a file should be,
huge numbers, deep nesting.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hubgym.errors import EnvContractError, HubgymError, ManifestError, ShardError, SkippedShardsWarning
from hubgym.hub import LocalHub
from hubgym.envs import load_env, push_env
from hubgym.hub.manifest import METADATA_FILES
from hubgym.hub.manifest import MANIFEST_FILE, config_files, read_manifest
from hubgym.hub.rollouts import iter_rollouts, open_rollouts, push_rollouts
from hubgym.hub.trust import load_hub_verifier
from hubgym.hub.rollout_stats import scan_rollouts, summarize
from hubgym.score.stored import open_source
from hubgym.train.local_shards import LocalShards

from helpers.scored_runs import ROWS_PER_SHARD, RUN, write_run


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict[str, Any]:
    """A run folder, and a local hub holding it pushed (org/rollouts) and the arithmetic env (org/arith)."""
    root = tmp_path_factory.mktemp("stored")
    run = write_run(root / "run")
    hub = LocalHub(root / "hub")
    pushed = push_rollouts(run, "org/rollouts", hub=hub)
    env = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], overrides={"sizes": {"train": 4, "test": 4}})
    return {"run": run, "hub": hub, "rollouts": pushed, "env": env}


def fresh_run(stored, tmp_path: Path) -> Path:
    shutil.rmtree(tmp_path / "run", ignore_errors=True)
    return Path(shutil.copytree(stored["run"], tmp_path / "run"))


def shard_paths(run: Path) -> list[Path]:
    return sorted((run / "shards").glob("*.arrow"))


# -- damage ---------------------------------------------------------------------------------------------


def flip(at: float) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        i = min(int(at * len(data)), len(data) - 1)
        return data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:]
    return damage


def _after_first_quote(insert: bytes) -> Callable[[bytes], bytes]:
    return lambda data: data.replace(b'"', b'"' + insert, 1)


# name -> (damage to the bytes, whether every reader must refuse the result)
JSON_DAMAGE: dict[str, tuple[Callable[[bytes], bytes], bool]] = {
    "truncated": (lambda d: d[: len(d) // 2], True),
    "last byte cut": (lambda d: d.rstrip()[:-1], True),
    "empty": (lambda d: b"", True),
    "latin-1": (lambda d: d.decode().replace('"', '"café ', 1).encode("latin-1"), True),
    "invalid utf-8": (_after_first_quote(b"\xc3\x28"), True),
    "utf-16 with BOM": (lambda d: d.decode().encode("utf-16"), True),
    "utf-8 BOM": (lambda d: b"\xef\xbb\xbf" + d, True),
    "an array, not an object": (lambda d: b"[" + d + b"]", True),
    "a string, not an object": (lambda d: json.dumps(d.decode()).encode(), True),
    "null": (lambda d: b"null", True),
    "NUL bytes": (lambda d: b"\x00" * len(d), True),
    "a huge number": (lambda d: re.sub(rb"\b\d+\b", b"9" * 5000, d, count=1), False),
    "deep nesting": (lambda d: b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", True),
    "a huge string": (lambda d: re.sub(rb'"[^"]*"', b'"' + b"x" * (4 << 20) + b'"', d, count=1), False),
    "flip at 10%": (flip(0.1), False),
    "flip at 50%": (flip(0.5), False),
    "flip at 90%": (flip(0.9), False),
}

WRONG_VALUES = [None, True, 0, -1, 1.5, "x", [], {}, [1, "a"], {"a": None}]


def _same_type(a: Any, b: Any) -> bool:
    return type(a) is type(b)


def wrong_types(doc: Any, depth: int = 4, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, value) for every field up to `depth` levels down and every JSON value of another type than it has."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for key, value in items:
        here = path + (key,)
        out += [(here, wrong) for wrong in WRONG_VALUES if not _same_type(wrong, value)]
        if depth > 1:
            out += wrong_types(value, depth - 1, here)
    return out


def replaced(doc: Any, path: tuple, value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


SHARD_NAME = "/shards/"  # how an error names one of the run's shards (or one its manifest lists)


def outcome(read: Callable[[], Any], error: type[Exception] | tuple, *names: str) -> str:
    """'read' or 'refused'; anything else (another exception, or the error naming none of `names`) fails the test.

    A damaged manifest may be refused for what it records (a sha256 or row count the shard does not match):
    that error names the shard, so SHARD_NAME is among the names there."""
    try:
        read()
    except error as exc:
        assert any(name in str(exc) for name in names), f"{type(exc).__name__} names none of {names}: {exc}"
        return "refused"
    return "read"


def escapes(cases, readers: dict[str, Callable[[], Any]], error, *names: str) -> list[str]:
    """Run every reader; the cases where something other than `error` naming `name` came out."""
    bad = []
    for reader, read in readers.items():
        try:
            outcome(read, error, *names)
        except Exception as exc:  # what the test is looking for: anything but the named error
            bad.append(f"{cases} / {reader}: {type(exc).__name__}: {str(exc)[:200]}")
    return bad


# -- shards ---------------------------------------------------------------------------------------------


def _rewrite(path: Path, change: Callable[[pa.Table], pa.Table]) -> None:
    with pa.memory_map(str(path)) as f:
        table = change(pa.ipc.open_file(f).read_all())
    path.unlink()
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)


def _set_column(name: str, values: Callable[[pa.Table], pa.Array]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        _rewrite(path, lambda t: t.set_column(t.schema.get_field_index(name), name, values(t)))
    return damage


def _bytes(change: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(change(path.read_bytes()))


def _folder(path: Path) -> None:
    path.unlink()
    (path / "part").mkdir(parents=True)


def _info_not_json(t: pa.Table) -> pa.Array:
    storage = pa.array(["{not json"] * t.num_rows, pa.string())
    return pa.ExtensionArray.from_storage(t.schema.field("info").type, storage)


# name -> (damage to shard 0, whether it is refused even when no manifest recorded the shard's sha256)
SHARD_DAMAGE: dict[str, tuple[Callable[[Path], None], bool]] = {
    "truncated": (_bytes(lambda d: d[: len(d) // 2]), True),
    "footer cut": (_bytes(lambda d: d[:-6]), True),
    "empty": (_bytes(lambda d: b""), True),
    "not Arrow": (_bytes(lambda d: b'{"rollout_id": "x"}\n'), True),
    "flip at 1%": (_bytes(flip(0.01)), False),
    "flip at 50%": (_bytes(flip(0.5)), False),
    "flip at 99%": (_bytes(flip(0.99)), False),
    "a folder": (_folder, True),
    "deleted": (lambda path: path.unlink(), False),  # listed by the manifest: refused only when recorded
    "reward as string": (_set_column("reward", lambda t: t.column("reward").cast(pa.string())), True),
    "sample as int64": (_set_column("sample", lambda t: t.column("sample").cast(pa.int64())), True),
    "completion missing": (lambda p: _rewrite(p, lambda t: t.drop_columns(["completion"])), True),
    "info not JSON": (_set_column("info", _info_not_json), True),
}

SHARD_READERS: dict[str, Callable[[Path], Any]] = {
    "iter_rollouts": lambda run: list(iter_rollouts(run)),
    "open_rollouts": lambda run: list(open_rollouts(run)),
    "open_rollouts (a Dataset)": lambda run: len(open_rollouts(run, streaming=False, cache_dir=run.parent / "ds")),
    "report (scan_rollouts)": lambda run: summarize(scan_rollouts([run])),
    "score (open_source)": lambda run: list(open_source(str(run)).batches),
    "train (LocalShards)": lambda run: list(LocalShards(run)),
    "push_rollouts": lambda run: push_rollouts(run, "org/other", hub=LocalHub(run.parent / "hub2")),
}


@pytest.mark.parametrize("recorded", [True, False], ids=["sha256 recorded", "nothing recorded"])
@pytest.mark.parametrize("damage", list(SHARD_DAMAGE))
def test_a_damaged_shard_is_named_by_every_reader_and_the_others_stay_readable(stored, tmp_path, damage, recorded):
    run = fresh_run(stored, tmp_path)
    if not recorded:
        (run / "manifest-w000of001.json").unlink()
    bad = shard_paths(run)[0]
    change, refused_unrecorded = SHARD_DAMAGE[damage]
    change(bad)
    must_refuse = recorded or refused_unrecorded
    if damage == "deleted" and not recorded:
        return  # nothing says it existed: the run simply holds the other shard
    for reader, read in SHARD_READERS.items():
        if reader == "push_rollouts" and not recorded:
            continue  # push needs the manifest (a run folder without one is refused as not a run)
        try:
            result = outcome(lambda: read(run), ShardError, bad.name)
        except Exception as exc:
            pytest.fail(f"{reader}: {type(exc).__name__} escaped: {exc}")
        assert result == "refused" or not must_refuse, f"{reader} read the {damage} shard"

    if must_refuse:  # skip_bad: the other shard is read, and the bad one is named once
        with pytest.warns(SkippedShardsWarning, match=re.escape(bad.name)):
            assert len(list(iter_rollouts(run, skip_bad=True))) == ROWS_PER_SHARD
        with pytest.warns(SkippedShardsWarning, match=re.escape(bad.name)):
            assert summarize(scan_rollouts([run], skip_bad=True))["rollouts"].sum() == ROWS_PER_SHARD
        with pytest.warns(SkippedShardsWarning, match=re.escape(bad.name)):
            assert sum(b.num_rows for b in open_source(str(run), skip_bad=True).batches) == ROWS_PER_SHARD


def test_every_shard_bad_is_one_error_for_every_reader(stored, tmp_path):
    """Skipping every shard would read nothing and look like success: each reader says so instead."""
    run = fresh_run(stored, tmp_path)
    for path in shard_paths(run):
        path.write_bytes(b"")
    readers = {"scan_rollouts": lambda: scan_rollouts([run], skip_bad=True),
               "iter_rollouts": lambda: list(iter_rollouts(run, skip_bad=True)),
               "open_source": lambda: [b.num_rows for b in open_source(str(run), skip_bad=True).batches]}
    for name, read in readers.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SkippedShardsWarning)
            with pytest.raises(HubgymError, match=r"every one of the 2 shard\(s\) read is bad"):
                read()


# -- a run's manifest-*.json ------------------------------------------------------------------------------

RUN_READERS: dict[str, Callable[[Path], Any]] = {
    "iter_rollouts": lambda run: list(iter_rollouts(run)),
    "train (LocalShards)": lambda run: list(LocalShards(run)),
    "report (scan_rollouts)": lambda run: summarize(scan_rollouts([run])),
    "score (open_source)": lambda run: list(open_source(str(run)).batches),
}


@pytest.mark.parametrize("damage", list(JSON_DAMAGE) + ["a folder"])
def test_a_damaged_run_manifest_is_named_by_every_reader(stored, tmp_path, damage):
    run = fresh_run(stored, tmp_path)
    manifest = run / "manifest-w000of001.json"
    if damage == "a folder":
        manifest.unlink()
        manifest.mkdir()
        must_refuse = True
    else:
        change, must_refuse = JSON_DAMAGE[damage]
        manifest.write_bytes(change(manifest.read_bytes()))
    readers = {**RUN_READERS, "push_rollouts": lambda r: push_rollouts(r, "org/other", hub=LocalHub(tmp_path / "h"))}
    for reader, read in readers.items():
        try:
            result = outcome(lambda: read(run), (ManifestError, ShardError), manifest.name, SHARD_NAME)
        except Exception as exc:
            pytest.fail(f"{reader}: {type(exc).__name__} escaped: {exc}")
        assert result == "refused" or not must_refuse, f"{reader} read past the {damage} manifest"


@pytest.mark.slow
def test_a_run_manifest_field_of_any_wrong_type_is_named(stored, tmp_path):
    run = fresh_run(stored, tmp_path)
    manifest = run / "manifest-w000of001.json"
    original = json.loads(manifest.read_text())
    bad = []
    for path, value in wrong_types(original):
        manifest.write_text(json.dumps(replaced(original, path, value)))
        bad += escapes(f"{'.'.join(map(str, path))}={value!r}", {k: (lambda r=r: r(run)) for k, r in
                                                                 RUN_READERS.items()},
                       (ManifestError, ShardError), manifest.name, SHARD_NAME)
    assert not bad, "\n".join(bad)


def test_a_manifest_that_records_a_shard_it_lacks_names_the_shard(stored, tmp_path):
    run = fresh_run(stored, tmp_path)
    gone = shard_paths(run)[1]
    gone.unlink()
    for reader, read in RUN_READERS.items():
        with pytest.raises(ShardError, match=rf"shard .*{re.escape(gone.name)} is listed in its run's manifest but "
                                             r"missing"):
            read(run)


# -- a rollout repo: index.json, summary.json, README.md --------------------------------------------------


def _commit(stored, repo: str, path: str, data: bytes) -> str:
    return stored["hub"].commit(repo, {path: data}, f"damage {path}")


def _original(stored, repo: str, path: str) -> bytes:
    pushed_revision = stored["rollouts"].revision if repo == "org/rollouts" else stored["env"].revision
    return (stored["hub"].resolve(repo, pushed_revision).path / path).read_bytes()


def _index_readers(stored, tmp_path) -> dict[str, Callable[[], Any]]:
    hub = stored["hub"]
    return {"iter_rollouts": lambda: list(iter_rollouts(f"org/rollouts:{RUN}", hub=hub)),
            "open_rollouts": lambda: list(open_rollouts(f"org/rollouts:{RUN}", hub=hub)),
            "score (open_source)": lambda: list(open_source(f"org/rollouts:{RUN}", hub=hub).batches),
            "push_rollouts": lambda: push_rollouts(fresh_run(stored, tmp_path), "org/rollouts", hub=hub)}


@pytest.mark.parametrize("damage", list(JSON_DAMAGE))
def test_a_damaged_index_json_is_named_by_every_reader(stored, tmp_path, damage):
    original = _original(stored, "org/rollouts", f"{RUN}/index.json")
    change, must_refuse = JSON_DAMAGE[damage]
    _commit(stored, "org/rollouts", f"{RUN}/index.json", change(original))
    try:
        for reader, read in _index_readers(stored, tmp_path).items():
            try:
                result = outcome(read, (ManifestError, ShardError), "index.json", f"{RUN}/shards/")
            except Exception as exc:
                pytest.fail(f"{reader}: {type(exc).__name__} escaped: {exc}")
            assert result == "refused" or not must_refuse, f"{reader} read past the {damage} index.json"
    finally:
        _commit(stored, "org/rollouts", f"{RUN}/index.json", original)


@pytest.mark.slow
def test_an_index_json_field_of_any_wrong_type_is_named(stored, tmp_path):
    original_bytes = _original(stored, "org/rollouts", f"{RUN}/index.json")
    original = json.loads(original_bytes)
    readers = {k: v for k, v in _index_readers(stored, tmp_path).items() if k in ("iter_rollouts", "open_rollouts")}
    bad = []
    try:
        for path, value in wrong_types(original, depth=3):
            _commit(stored, "org/rollouts", f"{RUN}/index.json", json.dumps(replaced(original, path, value)).encode())
            bad += escapes(f"{'.'.join(map(str, path))}={value!r}", readers, (ManifestError, ShardError),
                           "index.json", f"{RUN}/shards/")
    finally:
        _commit(stored, "org/rollouts", f"{RUN}/index.json", original_bytes)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("damage", ["truncated", "latin-1", "utf-16 with BOM", "an array, not an object",
                                    "deep nesting", "workers of the wrong type", "a stat missing"])
def test_a_damaged_summary_json_is_named_when_the_next_push_reads_it(stored, tmp_path, damage):
    path = f"{RUN}/summary.json"
    original = _original(stored, "org/rollouts", path)
    summary = json.loads(original)
    worker = next(iter(summary["workers"]))
    data = {"workers of the wrong type": json.dumps({**summary, "workers": [1]}).encode(),
            "a stat missing": json.dumps(replaced(summary, ("workers", worker, "arithmetic"), {"rollouts": 1})
                                         ).encode()}.get(damage) or JSON_DAMAGE[damage][0](original)
    _commit(stored, "org/rollouts", path, data)
    try:
        other = write_run(tmp_path / "r2", run_id="r2")
        with pytest.raises(ManifestError, match=re.escape(f"{RUN}/summary.json")):
            push_rollouts(other, "org/rollouts", hub=stored["hub"])
    finally:
        _commit(stored, "org/rollouts", path, original)


@pytest.mark.parametrize("damage", list(JSON_DAMAGE))
def test_a_damaged_card_is_never_read_by_hubgym(stored, tmp_path, damage):
    """Cards are for people and for datasets.load_dataset: hubgym's readers do not parse them, so a bad one
    changes nothing for iter_rollouts, push_rollouts or load_env."""
    for repo in ("org/rollouts", "org/arith"):
        _commit(stored, repo, "README.md", JSON_DAMAGE[damage][0](_original(stored, repo, "README.md")))
    assert len(list(iter_rollouts(f"org/rollouts:{RUN}", hub=stored["hub"]))) == 2 * ROWS_PER_SHARD
    env = load_env("org/arith", split="test", trust=True, hub=stored["hub"])
    assert env.tasks.num_rows == 4


# -- an env repo's hubgym.json ----------------------------------------------------------------------------


def _env_folder(stored, tmp_path: Path) -> Path:
    """A copy of the pushed env's metadata files (hubgym.json, verifier.py, golden.jsonl, README.md)."""
    snapshot = stored["hub"].resolve("org/arith", stored["env"].revision, patterns=METADATA_FILES).path
    folder = tmp_path / "env"
    folder.mkdir(exist_ok=True)
    for name in METADATA_FILES:
        if (snapshot / name).is_file():
            (folder / name).write_bytes((snapshot / name).read_bytes())
    return folder


ENV_REF = "org/arith@0123abc"


def read_env_metadata(folder: Path) -> None:
    """What load_env reads before the data: the manifest, the verifier (trusted), the files of a config."""
    ref = ENV_REF
    manifest = read_manifest(folder, ref)
    load_hub_verifier(folder, manifest, ref, trust=True)
    config_files(manifest, ref, None, "test")


def _env_error(exc: Exception) -> bool:
    """A hubgym error naming hubgym.json, or the repo (a flipped split name: "... has no split 'test'")."""
    return isinstance(exc, HubgymError) and any(name in str(exc) for name in (MANIFEST_FILE, "manifest", "org/arith@"))


def test_a_hubgym_json_field_of_any_wrong_type_is_named(stored, tmp_path):
    folder = _env_folder(stored, tmp_path)
    original = json.loads((folder / MANIFEST_FILE).read_text())
    bad = []
    for path, value in wrong_types(original, depth=5):
        (folder / MANIFEST_FILE).write_text(json.dumps(replaced(original, path, value)))
        try:
            read_env_metadata(folder)
        except Exception as exc:
            if not _env_error(exc):
                bad.append(f"{'.'.join(map(str, path))}={value!r}: {type(exc).__name__}: {str(exc)[:200]}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("damage", list(JSON_DAMAGE) + ["a folder"])
def test_a_damaged_hubgym_json_is_named_by_load_env(stored, tmp_path, damage):
    original = _original(stored, "org/arith", MANIFEST_FILE)
    if damage == "a folder":
        folder = _env_folder(stored, tmp_path)
        (folder / MANIFEST_FILE).unlink()
        (folder / MANIFEST_FILE).mkdir()
        with pytest.raises(EnvContractError, match=rf"{re.escape(MANIFEST_FILE)} of .* cannot be read"):
            read_env_metadata(folder)
        return
    change, must_refuse = JSON_DAMAGE[damage]
    _commit(stored, "org/arith", MANIFEST_FILE, change(original))
    try:
        load_env("org/arith", split="test", trust=True, hub=stored["hub"])
    except Exception as exc:
        assert _env_error(exc), f"{type(exc).__name__} escaped: {exc}"
    else:
        assert not must_refuse, f"load_env read past the {damage} {MANIFEST_FILE}"
    finally:
        _commit(stored, "org/arith", MANIFEST_FILE, original)


def test_hubgym_json_naming_data_files_the_repo_lacks_is_named(stored, tmp_path):
    original = _original(stored, "org/arith", MANIFEST_FILE)
    manifest = json.loads(original)
    manifest["configs"]["easy"]["splits"]["test"]["files"] = ["data/easy/tesu-00000-of-00001.parquet"]
    _commit(stored, "org/arith", MANIFEST_FILE, json.dumps(manifest).encode())
    try:
        with pytest.raises(EnvContractError, match=r"hubgym\.json of org/arith@\w+ names the data file "
                                                   r"'data/easy/tesu-00000-of-00001\.parquet'"):
            load_env("org/arith", split="test", trust=True, hub=stored["hub"])
    finally:
        _commit(stored, "org/arith", MANIFEST_FILE, original)


# -- bit flips and truncations anywhere (hypothesis) -------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_bit_flip_or_cut_of_a_stored_json_file_is_read_or_named(stored, tmp_path, data):
    """Manifest, hubgym.json: any one flipped bit, or the file cut anywhere, reads fine or is the named error."""
    kind = data.draw(st.sampled_from(["run manifest", "hubgym.json"]))
    if kind == "run manifest":
        run = tmp_path / "run"
        if not run.exists():
            shutil.copytree(stored["run"], run)
        target = run / "manifest-w000of001.json"
        original = stored["run"].joinpath(target.name).read_bytes()
    else:
        folder = _env_folder(stored, tmp_path)
        target = folder / MANIFEST_FILE
        original = target.read_bytes()
    at = data.draw(st.integers(0, len(original) - 1))
    damaged = data.draw(st.sampled_from([
        original[:at] + bytes([original[at] ^ (1 << data.draw(st.integers(0, 7)))]) + original[at + 1:],
        original[:at]]))
    target.write_bytes(damaged)
    try:
        if kind == "run manifest":
            for read in RUN_READERS.values():
                outcome(lambda: read(target.parent), (ManifestError, ShardError), target.name, SHARD_NAME)
        else:
            try:
                read_env_metadata(target.parent)
            except Exception as exc:
                assert _env_error(exc), f"{type(exc).__name__} escaped: {exc}"
    finally:
        target.write_bytes(original)
