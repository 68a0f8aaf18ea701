"""Push and load envs with the real huggingface_hub and datasets clients, over HTTP, against a loopback Hub."""

from __future__ import annotations

import logging

import datasets
import pytest

from hubgym.errors import EnvContractError, EnvNotFoundError, HubAuthError, HubConnectionError, VerifierNotTrustedError
from hubgym.hub import HfHub, load_env, push_env

from hub_server import TOKEN

pytest_plugins = ["hub_server"]  # the hub_server and hub_client fixtures (tests/hub_server.py)
# huggingface_hub's LFS upload passes a file object as `data=`, which httpx2 deprecates: not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")

SMALL = {"sizes": {"train": 6, "test": 3}}


@pytest.fixture
def hub(hub_client, tmp_path, monkeypatch):
    """An HfHub on the loopback server, which demands TOKEN (given through HF_TOKEN)."""
    hub_client.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return HfHub(cache_dir=tmp_path / "snapshots", backoff_s=0.01)


def push_small(hub, **kwargs):
    return push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], **{"overrides": SMALL, **kwargs})


def test_push_then_load_dataset_from_the_hub_by_config_and_split(hub, hub_client, tmp_path):
    result = push_small(hub)
    store = hub_client.store
    assert store.refs("dataset", "org/arith")["main"] == result.revision == hub.resolve("org/arith").revision
    tree = store.tree("dataset", "org/arith", result.revision)
    assert tree["data/easy/test-00000-of-00001.parquet"]["lfs"] and not tree["hubgym.json"]["lfs"]
    assert hub_client.count("PUT", r"^/lfs-upload/") == 2 and hub_client.count("POST", r"/commit/main$") == 1
    test = datasets.load_dataset("org/arith", "easy", split="test", token=TOKEN, cache_dir=str(tmp_path / "ds"))
    streamed = datasets.load_dataset("org/arith", "easy", split="test", streaming=True, token=TOKEN)
    assert len(test) == 3 and [r["id"] for r in streamed] == test["id"]
    assert test[0]["info"]["answer"] and test[0]["prompt"][-1]["role"] == "user"
    env = load_env(result.ref, hub=hub, pin="sha256:" + result.manifest["verifier"]["sha256"], split="test")
    assert env.tasks["id"] == test["id"] and env.verifier.name == "hubgym.verifiers.arithmetic"
    assert [r.id for r in hub.revisions("org/arith")][0] == result.revision


def test_repush_makes_a_new_revision_and_the_old_one_stays_loadable(hub):
    first = push_small(hub)
    second = push_small(hub, overrides={"sizes": {"train": 4, "test": 2}})
    assert second.revision != first.revision
    assert [r.id for r in hub.revisions("org/arith")] [:2] == [second.revision, first.revision]
    assert len(load_env(first.ref, hub=hub, trust=True, split="test").tasks) == 3
    assert len(load_env("org/arith", hub=hub, trust=True, split="test").tasks) == 2
    assert push_small(hub, overrides={"sizes": {"train": 4, "test": 2}}).revision == second.revision  # no-op push


def test_streaming_load_reads_the_data_remotely(hub):
    result = push_small(hub)
    env = load_env(result.ref, hub=hub, trust=True, streaming=True, split="train")
    assert isinstance(env.tasks, datasets.IterableDataset)
    rows = list(env.tasks)
    assert len(rows) == 6 and rows[0]["info"]["answer"] is not None
    assert not (env.path / "data").exists()  # only the small files were downloaded
    assert sorted(p.name for p in env.path.iterdir()) == ["README.md", "golden.jsonl", "hubgym.json", "verifier.py"]


def test_missing_repo_revision_manifest_and_pin_over_http(hub):
    with pytest.raises(EnvNotFoundError, match=r"no repo 'org/nope' on the hf hub \(http://127\.0\.0\.1:\d+/datasets/"):
        load_env("org/nope", hub=hub)
    push_small(hub)
    with pytest.raises(EnvNotFoundError, match=r"repo 'org/arith' on the hf hub has no revision 'v9'"):
        load_env("org/arith@v9", hub=hub)
    with pytest.raises(VerifierNotTrustedError, match=r"Its sha256 is [0-9a-f]{64}\. Read .*verifier\.py, then pin"):
        load_env("org/arith", hub=hub)
    hub.create_repo("org/data")
    hub.commit("org/data", {"README.md": b"# only data\n"}, "no manifest")
    with pytest.raises(EnvContractError, match=r"repo org/data@[0-9a-f]{40} has no hubgym.json"):
        load_env("org/data", hub=hub)


def test_a_dropped_commit_or_upload_is_retried(hub, hub_client):
    hub_client.drop("commit", 1)
    hub_client.drop("upload", 1)
    result = push_small(hub)
    assert [m for m, _ in hub_client.dropped] == ["PUT", "POST"]
    assert hub_client.count("POST", r"/commit/main$") == 2
    assert hub.resolve("org/arith").revision == result.revision
    assert len(load_env(result.ref, hub=hub, trust=True, split="test").tasks) == 3


def test_a_lost_commit_answer_does_not_commit_twice(hub, hub_client):
    push_small(hub)
    hub_client.drop("commit", 1, when="after")  # the server applies the commit, the answer never arrives
    result = push_small(hub, overrides={"sizes": {"train": 2, "test": 1}})
    assert hub_client.count("POST", r"/commit/main$") == 2  # the first push, then the one whose answer was lost
    assert len(hub.revisions("org/arith")) == 3  # initial, first push, second push: no duplicate
    assert hub.resolve("org/arith").revision == result.revision


def test_a_hub_that_keeps_dropping_leaves_the_old_revision(hub, hub_client, tmp_path):
    first = push_small(hub)
    hub_client.drop("commit", 100)
    with pytest.raises(HubConnectionError, match=r"cannot push to org/arith at .* after 4 attempts: RemoteProtocol"):
        push_small(hub, overrides={"sizes": {"train": 2, "test": 1}})
    assert hub_client.count("POST", r"/commit/main$") == 1 + 4  # retries=3
    assert hub.resolve("org/arith").revision == first.revision
    assert len(load_env("org/arith", hub=hub, trust=True, split="test").tasks) == 3
    plain = datasets.load_dataset("org/arith", "easy", split="test", token=TOKEN, cache_dir=str(tmp_path / "ds"))
    assert len(plain) == 3


def test_missing_or_refused_credentials_give_a_clear_message_and_never_show_the_token(
        hub_client, tmp_path, monkeypatch, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    hub_client.token = TOKEN
    with pytest.raises(HubAuthError, match=r"needs credentials \(401\) and none were found\. Set HF_TOKEN"):
        push_small(HfHub(cache_dir=tmp_path / "s", backoff_s=0.01))
    wrong = "hf_wrongTokenValue987654321"
    monkeypatch.setenv("HF_TOKEN", wrong)
    refused = r"refused the token from HF_TOKEN \(401\).*the token is not shown"
    with pytest.raises(HubAuthError, match=refused) as caught:
        push_small(HfHub(cache_dir=tmp_path / "s", backoff_s=0.01))
    hub = HfHub(token=wrong, cache_dir=tmp_path / "s")
    with pytest.raises(HubAuthError, match="refused the token from the token argument") as caught_arg:
        hub.create_repo("org/other")
    shown = str(caught.value) + str(caught_arg.value) + repr(hub) + caplog.text + "".join(capsys.readouterr())
    assert wrong not in shown and TOKEN not in shown
    assert not hub_client.store.exists("dataset", "org/arith")


def test_an_unreachable_hub_is_a_clear_error_and_a_loaded_revision_stays_usable(hub, hub_server):
    result = push_small(hub)
    load_env(result.ref, hub=hub, trust=True, split="test")
    hub_server.stop()
    again = load_env(result.ref, hub=hub, trust=True, split="test")  # the pinned revision, from the local cache
    assert len(again.tasks) == 3 and again.revision == result.revision
    with pytest.raises(HubConnectionError, match=r"cannot download org/other@main at .*: ConnectError"):
        load_env("org/other", hub=hub)
    with pytest.raises(HubConnectionError, match=r"cannot create org/arith at .* after 4 attempts: ConnectError"):
        push_small(hub)
