"""Push and load envs through the local hub folder: layout, revisions, plain load_dataset, pinning, faults."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path

import datasets
import pytest

import hubgym
from hubgym.builders.arithmetic import Arithmetic
from hubgym.errors import EnvContractError, EnvNotFoundError, VerifierNotTrustedError
from hubgym.hub.trust import code_sha256
from hubgym.hub import HfHub, LocalHub, get_hub, parse_ref
from hubgym.envs import load_env, push_env
from hubgym.hub import local as local_module
from hubgym.score.choice import VerifierChoice
from hubgym.verifiers import load_verifier

SMALL = {"sizes": {"train": 6, "test": 3}}

ECHO_BUILDER = '''
from hubgym import TaskBuilder, TaskConfig, make_task, user


class Echo(TaskBuilder):
    """Echo: say the word back."""

    ENV = "echo"
    VERIFIER = "verifier.py"
    GOLDEN = "golden.jsonl"
    BUILDER_CONFIGS = [TaskConfig(name="default", sizes={"train": 3, "test": 2})]

    def generate_tasks(self, split, size, seed):
        if self.config.seed == 13:
            raise RuntimeError("the builder broke")
        for i in range(size):
            yield make_task(self.ENV, [user(f"say {split}{i}")], {"word": f"{split}{i}"})
'''

ECHO_VERIFIER = '''
import os
import pathlib

if os.environ.get("ECHO_MARKER"):  # an import-time side effect: shows whether this code ever ran
    pathlib.Path(os.environ["ECHO_MARKER"]).write_text("ran")


def said(task, completion):
    return float(task["info"]["word"] in (completion[-1]["content"] or ""))


REWARDS = {said: 1.0}
'''


def echo_env(tmp_path):
    folder = tmp_path / "echo"
    folder.mkdir()
    (folder / "builder.py").write_text(ECHO_BUILDER)
    (folder / "verifier.py").write_text(ECHO_VERIFIER)
    (folder / "golden.jsonl").write_text("")
    return str(folder)


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    """arithmetic/easy (6 train + 3 test rows) pushed once to a local hub, shared by read-only tests."""
    hub = LocalHub(tmp_path_factory.mktemp("hub"))
    return hub, push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], overrides=SMALL)


def test_push_lays_out_a_hub_repo_with_card_verifier_and_manifest(pushed):
    hub, result = pushed
    snapshot = hub.resolve("org/arith")
    assert snapshot.revision == result.revision and re.fullmatch(r"[0-9a-f]{40}", result.revision)
    files = sorted(str(p.relative_to(snapshot.path)) for p in snapshot.path.rglob("*") if p.is_file())
    assert files == [".gitattributes", "README.md", "data/easy/test-00000-of-00001.parquet",
                     "data/easy/train-00000-of-00001.parquet", "golden.jsonl", "hubgym.json", "verifier.py"]
    manifest = json.loads((snapshot.path / "hubgym.json").read_text())
    verifier = load_verifier("hubgym.verifiers.arithmetic")
    assert manifest["env"] == "arithmetic" and manifest["env_version"] == 2 and manifest["schema_version"] == "1.0"
    assert manifest["verifier"]["path"] == "verifier.py" and manifest["verifier"]["sha256"] == verifier.sha256
    assert (snapshot.path / "verifier.py").read_bytes() == verifier.source_path.read_bytes()
    assert manifest["interaction"]["kind"] == "single_turn" and manifest["tools"] == []
    assert manifest["configs"]["easy"]["params"]["sizes"] == SMALL["sizes"]
    assert manifest["configs"]["easy"]["params"]["max_value"] == 9
    assert manifest["configs"]["easy"]["splits"]["test"]["num_rows"] == 3
    card = (snapshot.path / "README.md").read_text()
    assert "config_name: easy" in card and "- data/easy/test-00000-of-00001.parquet" in card
    assert manifest["code"] == {"files": {"verifier.py": verifier.sha256},
                                "sha256": code_sha256({"verifier.py": verifier.sha256})}
    assert "| `correct` | 1.0 |" in card and f"pin=\"sha256:{manifest['code']['sha256']}\"" in card
    assert [r.message for r in hub.revisions("org/arith")] == ["Push arithmetic-v2 (easy)", "initial commit"]


def test_snapshot_loads_with_plain_load_dataset_by_config_and_split(pushed):
    hub, result = pushed
    path = str(hub.resolve("org/arith", result.revision).path)
    test = datasets.load_dataset(path, "easy", split="test")
    built = Arithmetic(config_name="easy", sizes=SMALL["sizes"], cache_dir=str(hub.root / "build"))
    built.download_and_prepare()
    assert test["id"] == built.as_dataset("test")["id"] and test[0]["info"] == built.as_dataset("test")[0]["info"]
    streamed = datasets.load_dataset(path, "easy", split="train", streaming=True)
    assert [row["id"] for row in streamed] == built.as_dataset("train")["id"]


def test_load_env_returns_tasks_and_the_pinned_verifier(pushed):
    hub, result = pushed
    sha = result.manifest["code"]["sha256"]
    env = load_env(result.ref, hub=hub, pin=f"sha256:{sha}", split="test")
    assert env.revision == result.revision and env.config == "easy" and len(env.tasks) == 3
    task = env.tasks[0]
    score = env.verifier.score(task, [{"role": "assistant", "content": f"<answer>{task['info']['answer']}</answer>"}])
    assert score.reward == 1.0 and env.verifier.code_sha256 == sha
    short = load_env(f"org/arith@{result.revision[:8]}", hub=hub, pin=sha, split="test")
    assert short.revision == result.revision
    streamed = load_env("org/arith", hub=hub, pin=sha, streaming=True)
    assert isinstance(streamed.tasks, datasets.IterableDatasetDict)
    assert [r["id"] for r in streamed.tasks["test"]] == env.tasks["id"]


def test_repush_makes_a_new_revision_and_the_old_one_stays_loadable(tmp_path):
    hub = LocalHub(tmp_path / "hub")
    first = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], overrides=SMALL)
    second = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"],
                      overrides={"sizes": {"train": 4, "test": 2}, "seed": 1})
    assert second.revision != first.revision
    assert [r.id for r in hub.revisions("org/arith")][:2] == [second.revision, first.revision]
    old = load_env(first.ref, hub=hub, trust=True, split="test")
    new = load_env("org/arith", hub=hub, trust=True, split="test")
    assert len(old.tasks) == 3 and len(new.tasks) == 2 and new.revision == second.revision
    again = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], overrides={"sizes": {"train": 4, "test": 2},
                                                                                       "seed": 1})
    assert again.revision == second.revision and len(hub.revisions("org/arith")) == 3  # nothing changed: no commit


def test_a_push_replaces_the_files_of_the_previous_one(tmp_path):
    hub = LocalHub(tmp_path / "hub")
    both = push_env("arithmetic", "org/arith", hub=hub, configs=["easy", "medium"], overrides=SMALL)
    easy = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], overrides=SMALL)
    assert not (hub.resolve("org/arith").path / "data" / "medium").exists()
    assert (hub.resolve("org/arith", both.revision).path / "data" / "medium").is_dir()
    with pytest.raises(EnvNotFoundError, match=r"has no config 'medium'; it has easy$"):
        load_env(easy.ref, hub=hub, trust=True, config="medium")
    assert len(load_env(both.ref, hub=hub, trust=True, config="medium", split="train").tasks) == 6


def test_multi_turn_env_round_trips_with_its_golden_cases(tmp_path):
    hub = LocalHub(tmp_path / "hub")
    result = push_env("wordle", "org/wordle", hub=hub, configs=["default"],
                      overrides={"sizes": {"train": 3, "test": 2}})
    assert result.manifest["kind"] == "multi_turn" and result.manifest["verifier"]["multi_turn"] is True
    env = load_env(result.ref, hub=hub, trust=True, split="test")
    assert env.tasks[0]["interaction"]["kind"] == "multi_turn"
    assert env.verifier.multi_turn and env.verifier.name == "hubgym.verifiers.wordle"  # the installed, identical module
    state, _ = env.verifier.reset(env.tasks[0])
    assert json.loads(json.dumps(state)) == state
    cases = env.golden_cases()
    assert cases
    for case in cases:
        completion = env.verifier.run_episode(case.task, case.actions).completion() if case.actions else case.completion
        assert env.verifier.score(case.task, completion).reward == pytest.approx(case.reward), case.name


# -- verifier pinning --------------------------------------------------------------------------------


@pytest.fixture
def echo_pushed(tmp_path, monkeypatch):
    hub, folder = LocalHub(tmp_path / "hub"), echo_env(tmp_path)
    result = push_env(folder, "org/echo", hub=hub)
    marker = tmp_path / "marker"
    monkeypatch.setenv("ECHO_MARKER", str(marker))
    return hub, result, marker, folder


def test_unpinned_verifier_is_refused_without_running_it(echo_pushed):
    hub, result, marker, _ = echo_pushed
    sha = result.manifest["code"]["sha256"]
    with pytest.raises(VerifierNotTrustedError) as caught:
        load_env("org/echo", hub=hub)
    message = str(caught.value)
    assert f"Its sha256 is {sha}" in message and f"pin='sha256:{sha}'" in message
    assert f"(CLI: --pin org/echo=sha256:{sha} --hub {hub.root}), or pass trust=True" in message
    assert caught.value.sha256 == sha and caught.value.revision == result.revision
    assert not marker.exists()


def test_wrong_pin_is_refused_without_running_it(echo_pushed):
    hub, result, marker, _ = echo_pushed
    sha, wrong = result.manifest["code"]["sha256"], "0" * 64
    with pytest.raises(VerifierNotTrustedError, match=f"its sha256 is {sha}, but the pin is sha256:{wrong}"):
        load_env("org/echo", hub=hub, pin=f"sha256:{wrong}", trust=True)  # a pin wins over trust
    with pytest.raises(VerifierNotTrustedError, match=r"pin 'sha256:abc' is not a sha256; write it as sha256:<64"):
        load_env("org/echo", hub=hub, pin="sha256:abc")
    assert not marker.exists()


def test_right_pin_or_trust_runs_the_verifier(echo_pushed):
    hub, result, marker, _ = echo_pushed
    env = load_env("org/echo", hub=hub, pin="sha256:" + result.manifest["code"]["sha256"], split="train")
    assert marker.read_text() == "ran"
    assert env.verifier.score(env.tasks[0], [{"role": "assistant", "content": "train0"}]).reward == 1.0
    assert load_env("org/echo", hub=hub, trust=True).verifier.sha256 == result.manifest["verifier"]["sha256"]


def test_verifier_edited_after_push_is_refused_even_with_trust(echo_pushed):
    hub, _, marker, _ = echo_pushed
    hub.commit("org/echo", {"verifier.py": b"REWARDS = {}\nimport os\n"}, "edit by hand")
    with pytest.raises(VerifierNotTrustedError, match="was edited by hand or is corrupt. Re-push the env"):
        load_env("org/echo", hub=hub, trust=True)
    assert not marker.exists()


# -- bad input and faults ----------------------------------------------------------------------------


def test_missing_repo_revision_and_manifest_are_clear_errors(pushed, tmp_path):
    hub, result = pushed
    with pytest.raises(EnvNotFoundError, match=r"no repo 'org/nope' on the local hub .*push one with `hubgym push"):
        load_env("org/nope", hub=hub)
    with pytest.raises(EnvNotFoundError, match=r"repo 'org/arith' on the local hub has no revision 'deadbeef0'"):
        load_env("org/arith@deadbeef0", hub=hub)
    with pytest.raises(EnvNotFoundError, match=r"no environment named 'arith'; known: arithmetic, "):
        load_env("arith", hub=hub)  # a bare word is an env name (hubgym.envs.refs): no such env
    with pytest.raises(EnvNotFoundError, match=r"'org/a/rith' is not a hub repo id: it must be an owner and a name "
                                               r"with one '/' between them; write org/name"):
        load_env("org/a/rith", hub=hub)
    with pytest.raises(EnvNotFoundError, match=r"config 'easy' of repo .* has no split 'dev'; it has train, test"):
        load_env(result.ref, hub=hub, trust=True, split="dev")
    bare = LocalHub(tmp_path / "bare")
    bare.create_repo("org/data")
    bare.commit("org/data", {"README.md": b"# just data\n"}, "data only")
    with pytest.raises(EnvContractError, match=r"repo org/data@[0-9a-f]{40} has no hubgym.json.*field='hubgym.json'"):
        load_env("org/data", hub=bare)


def test_a_failed_build_leaves_the_previous_revision(echo_pushed):
    hub, result, _, folder = echo_pushed
    with pytest.raises(datasets.exceptions.DatasetGenerationError):
        push_env(folder, "org/echo", hub=hub, overrides={"seed": 13})
    with pytest.raises(EnvContractError, match=r"cannot override the config of echo.*Fix: override only fields"):
        push_env(folder, "org/echo", hub=hub, overrides={"no_such_field": 1})
    assert hub.resolve("org/echo").revision == result.revision
    assert [r.id for r in hub.revisions("org/echo")][0] == result.revision


def test_an_interrupted_commit_leaves_the_previous_revision(tmp_path, monkeypatch):
    hub = LocalHub(tmp_path / "hub")
    first = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], overrides=SMALL)
    real_write = local_module._atomic_write

    def crash_at_the_commit_point(path, data):
        if path.name == "main":
            raise KeyboardInterrupt("power cut")
        real_write(path, data)

    monkeypatch.setattr(local_module, "_atomic_write", crash_at_the_commit_point)
    with pytest.raises(KeyboardInterrupt):
        push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], overrides={"sizes": {"train": 2, "test": 1}})
    assert hub.resolve("org/arith").revision == first.revision
    assert len(load_env("org/arith", hub=hub, trust=True, split="test").tasks) == 3
    with pytest.raises(FileNotFoundError):
        hub.commit("org/arith", {"data/x.parquet": tmp_path / "missing.parquet"}, "half a commit")
    monkeypatch.setattr(local_module, "_atomic_write", real_write)
    assert hub.resolve("org/arith").revision == first.revision
    again = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], overrides={"sizes": {"train": 2, "test": 1}})
    assert again.revision != first.revision and not any((hub.root / "datasets/org/arith/tmp").iterdir())


@pytest.mark.slow
def test_commits_stay_inside_the_repo_and_concurrent_commits_all_land(tmp_path):
    hub = LocalHub(tmp_path / "hub")
    hub.create_repo("org/r")
    for bad in ("../escape", "/abs", "a/../../b", ""):
        with pytest.raises(EnvContractError, match="is not a valid path in a repo"):
            hub.commit("org/r", {bad: b"x"}, "bad")
    threads = [threading.Thread(target=hub.commit, args=("org/r", {f"f{i}.txt": b"%d" % i}, f"c{i}")) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    head = hub.resolve("org/r").path
    assert sorted(p.name for p in head.iterdir()) == [".gitattributes"] + [f"f{i}.txt" for i in range(6)]
    assert len(hub.revisions("org/r")) == 7


def test_get_hub_and_parse_ref(tmp_path, monkeypatch):
    monkeypatch.setenv("HUBGYM_HUB", str(tmp_path / "h"))
    assert isinstance(get_hub(), LocalHub) and get_hub().root == tmp_path / "h"
    monkeypatch.setenv("HUBGYM_HUB", "hf")
    assert isinstance(get_hub(), HfHub)
    assert get_hub("http://127.0.0.1:9/").endpoint == "http://127.0.0.1:9"
    assert parse_ref("org/a-b.c@main") == ("org/a-b.c", "main") and parse_ref("org/x") == ("org/x", None)
    with pytest.raises(EnvNotFoundError, match="has an empty revision after '@'"):
        parse_ref("org/x@")


def test_the_docs_load_env_example_gives_what_it_says(pushed, monkeypatch):
    """The hub guide's `load_env` lines, run as written (placeholders filled in), give a Dataset and the Verifier."""
    hub, result = pushed
    page = (Path(__file__).parents[1] / "docs" / "hub.md").read_text()
    section = page[page.index("## Environments on a hub"):page.index("## Rollout repos")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace("my-org/arithmetic@<revision>", result.ref).replace(
        "<code sha256>", result.manifest["code"]["sha256"])
    monkeypatch.setenv("HUBGYM_HUB", str(hub.root))  # the example loads from the default hub
    scope = {"hubgym": hubgym}
    exec(code, scope)
    assert isinstance(scope["env"].tasks, datasets.Dataset) and len(scope["env"].tasks) == 3
    assert isinstance(scope["env"].verifier, hubgym.Verifier)
    assert "hub=" in section and "DatasetDict" in section


def test_a_verifier_reached_through_a_link_keeps_its_py_name_and_runs_the_bytes_hashed(tmp_path):
    """The Hugging Face cache layout: snapshots/<commit>/verifier.py -> ../../blobs/<sha>. The module is the
    .py file, and what runs is the bytes the caller read and hashed, not what the file holds a moment later."""
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "5ec6f1").write_text("def one(task, completion):\n    return 1.0\n\n\nREWARDS = {one: 1.0}\n")
    link = tmp_path / "snapshots" / "c0ffee" / "verifier.py"
    link.parent.mkdir(parents=True)
    link.symlink_to("../../blobs/5ec6f1")
    verifier = load_verifier(str(link))
    assert verifier.source_path == link and list(verifier.rewards) == ["one"]
    checked = b"def two(task, completion):\n    return 0.0\n\n\nREWARDS = {two: 1.0}\n"
    pinned = load_verifier(str(link), source=checked)  # the file now differs from the bytes that were checked
    assert list(pinned.rewards) == ["two"] and pinned.sha256 == hashlib.sha256(checked).hexdigest()
    assert pinned.module is not verifier.module  # same path, other bytes: another module
    assert VerifierChoice(str(link)).spec("e").sha256 == verifier.sha256  # `hubgym score --verifier LINK.py`
