"""Push and load envs with the real huggingface_hub and datasets clients, over HTTP, against a loopback Hub."""

from __future__ import annotations

import logging
import re

import datasets
import pytest

import hubgym
from hubgym.errors import EnvContractError, EnvNotFoundError, HubAuthError, HubConnectionError, VerifierNotTrustedError
from hubgym.hub import HfHub
from hubgym.envs import load_env, push_env

from helpers.hub_server import TOKEN

# huggingface_hub's LFS upload passes a file object as `data=`, which httpx2 deprecates: not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")

SMALL = {"sizes": {"train": 6, "test": 3}}


@pytest.fixture
def hub(hub_client, tmp_path, monkeypatch):
    """An HfHub on the loopback server, which demands TOKEN (given through HF_TOKEN)."""
    hub_client.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return HfHub(backoff_s=0.01)  # the client's default cache (HF_HUB_CACHE, set by hub_client): links into blobs/


def push_small(hub, **kwargs):
    return push_env("arithmetic", "org/arith", hub=hub, configs=["easy"], **{"overrides": SMALL, **kwargs})


@pytest.mark.slow
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
    env = load_env(result.ref, hub=hub, pin="sha256:" + result.manifest["code"]["sha256"], split="test")
    assert env.tasks["id"] == test["id"] and env.verifier.name == "hubgym.verifiers.arithmetic"
    assert [r.id for r in hub.revisions("org/arith")][0] == result.revision


@pytest.mark.slow
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


@pytest.mark.slow
def test_missing_repo_revision_manifest_and_pin_over_http(hub):
    with pytest.raises(EnvNotFoundError, match=r"no repo 'org/nope' on the hf hub \(http://127\.0\.0\.1:\d+/datasets/"):
        load_env("org/nope", hub=hub)
    push_small(hub)
    with pytest.raises(EnvNotFoundError, match=r"repo 'org/arith' on the hf hub has no revision 'v9'"):
        load_env("org/arith@v9", hub=hub)
    with pytest.raises(VerifierNotTrustedError,
                       match=r"Its sha256 is [0-9a-f]{64}\. Read verifier\.py in .*, then pin"):
        load_env("org/arith", hub=hub)
    hub.create_repo("org/data")
    hub.commit("org/data", {"README.md": b"# only data\n"}, "no manifest")
    with pytest.raises(EnvContractError, match=r"repo org/data@[0-9a-f]{40} has no hubgym.json"):
        load_env("org/data", hub=hub)


@pytest.mark.slow
def test_a_dropped_commit_or_upload_is_retried(hub, hub_client):
    hub_client.drop("commit", 1)
    hub_client.drop("upload", 1)
    result = push_small(hub)
    assert [m for m, _ in hub_client.dropped] == ["PUT", "POST"]
    assert hub_client.count("POST", r"/commit/main$") == 2
    assert hub.resolve("org/arith").revision == result.revision
    assert len(load_env(result.ref, hub=hub, trust=True, split="test").tasks) == 3


@pytest.mark.slow
def test_a_lost_commit_answer_does_not_commit_twice(hub, hub_client):
    push_small(hub)
    hub_client.drop("commit", 1, when="after")  # the server applies the commit, the answer never arrives
    result = push_small(hub, overrides={"sizes": {"train": 2, "test": 1}})
    assert hub_client.count("POST", r"/commit/main$") == 2  # the first push, then the one whose answer was lost
    assert len(hub.revisions("org/arith")) == 3  # initial, first push, second push: no duplicate
    assert hub.resolve("org/arith").revision == result.revision


@pytest.mark.slow
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


@pytest.mark.slow
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


# -- a user's env (its verifier is no installed module) through the client's cache, and short revisions --

WORDS_BUILDER = '''
from hubgym import TaskBuilder, TaskConfig, make_task, user


class Words(TaskBuilder):
    """words: say the word back."""

    ENV = "words"
    VERIFIER, GOLDEN = "verifier.py", "golden.jsonl"
    BUILDER_CONFIGS = [TaskConfig(name="default", sizes={"train": 3, "test": 2})]

    def generate_tasks(self, split, size, seed):
        for i in range(size):
            yield make_task(self.ENV, [user(f"say {split}{i}")], {"word": f"{split}{i}"})
'''

WORDS_VERIFIER = '''
def said(task, completion):
    return float(task["info"]["word"] in (completion[-1]["content"] or ""))


REWARDS = {said: 1.0}
'''


def words_env(tmp_path) -> str:
    folder = tmp_path / "words"
    folder.mkdir()
    (folder / "builder.py").write_text(WORDS_BUILDER)
    (folder / "verifier.py").write_text(WORDS_VERIFIER)
    (folder / "golden.jsonl").write_text("")
    return str(folder)


def test_a_verifier_pushed_over_http_loads_back_from_the_cache_links(hub, tmp_path):
    from hubgym.score.choice import VerifierChoice

    result = push_env(words_env(tmp_path), "org/words", hub=hub)
    pin = "sha256:" + result.manifest["code"]["sha256"]
    env = load_env(result.ref, hub=hub, pin=pin, split="test")
    linked = env.path / "verifier.py"
    assert linked.is_symlink() and linked.resolve().parent.name == "blobs"  # the client's default layout
    assert env.verifier.sha256 == result.manifest["verifier"]["sha256"]
    assert env.verifier.source_path.name == "verifier.py" and env.verifier.name.startswith("hubgym_user_verifier_")
    assert env.verifier.score(env.tasks[1], [{"role": "assistant", "content": "test1"}]).reward == 1.0
    choice = VerifierChoice(env_revision=[result.ref], pin=[f"org/words={pin}"], hub=hub)  # what `score` uses
    assert choice.spec("words").sha256 == env.verifier.sha256


@pytest.mark.slow
def test_a_short_revision_resolves_as_on_the_hub(hub):
    first = push_small(hub)
    second = push_small(hub, overrides={"sizes": {"train": 2, "test": 1}})
    for rev in (first.revision[:7], first.revision[:12]):
        assert hub.exists("org/arith", rev) and hub.resolve("org/arith", rev).revision == first.revision
        assert len(load_env(f"org/arith@{rev}", hub=hub, trust=True, split="test").tasks) == 3
    assert load_env(f"org/arith@{second.revision[:7]}", hub=hub, trust=True).revision == second.revision
    assert not hub.exists("org/arith", "0000000")


def test_the_refusal_and_the_push_result_name_the_hub_and_work_as_written(hub_spec, tmp_path, monkeypatch):
    result = push_env(words_env(tmp_path), "org/words", hub=hub_spec)
    sha = result.manifest["code"]["sha256"]
    python, cli = result.load_hints()
    assert python == f"hubgym.load_env({result.ref!r}, pin='sha256:{sha}', hub={hub_spec!r})"
    assert cli == f"--pin org/words=sha256:{sha} --hub {hub_spec}"  # what `rollout` and `score` take
    assert eval(python, {"hubgym": hubgym}).verifier.code_sha256 == sha  # exactly as printed
    with pytest.raises(VerifierNotTrustedError) as refused:
        load_env("org/words", hub=hub_spec)
    advice = re.search(r"then pin it: (hubgym\.load_env\(.*?\)) \(CLI: (.*?)\), or pass trust=True", str(refused.value))
    assert advice.group(2) == cli
    assert eval(advice.group(1), {"hubgym": hubgym}).verifier.code_sha256 == sha
    monkeypatch.setenv("HUBGYM_HUB", hub_spec)  # the default hub goes unnamed
    assert result.load_hints() == (python, cli)  # (the result keeps the hub it was pushed to)
    with pytest.raises(VerifierNotTrustedError) as unnamed:
        load_env("org/words")
    assert "hub=" not in str(unnamed.value) and "--hub" not in str(unnamed.value)
    assert f"(CLI: --pin org/words=sha256:{sha})" in str(unnamed.value)
