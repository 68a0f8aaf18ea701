"""Names that reach paths and URLs (repo ids, revisions, config and run names), fuzzed: each is refused with one
HubgymError naming the value and the rule, or used safely; nothing is read or written outside the hub folder."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hubgym.errors import EnvContractError, EnvNotFoundError, HubgymError
from hubgym.hub import HfHub, LocalHub, parse_ref, push_rollouts
from hubgym.envs import load_env, push_env
from hubgym.hub.names import MAX_NAME, check_name, check_repo_id, check_repo_path, check_revision, shown
from hubgym.hub.rollout_reader import parse_rollout_ref

from helpers.hub_server import TOKEN

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")

HOSTILE = ["..", ".", "/", "//", "\\", "\x00", "\n", "\r\n", " ", "\t", "%2e%2e", "%2f", "%00", "%2e%2e%2f", "~",
           "@", "@{", ":", "*", "?", "[", ".git", ".lock", "--", "-", "_", "é", "\u202e", "\u200b", "\uff0e\uff0e",
           "/etc/passwd", "C:\\Windows", "..\\..", "x" * 97, "y" * 300, "main", "0123abc", "refs/pr/1"]
pieces = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=10),
                   st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True))
names = st.lists(pieces, min_size=0, max_size=5).map("".join)
repo_ids = st.one_of(names, st.tuples(names, names).map("/".join))


def examples(*values):
    """Hypothesis `@example` for each value (the regressions each rule exists for)."""
    def apply(test):
        for value in reversed(values):
            test = (example(*value) if isinstance(value, tuple) else example(value))(test)
        return test
    return apply


FUZZ = settings(max_examples=300, deadline=None, database=None,  # no example database in the working tree
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def refused_clearly(error: HubgymError, value: str, rule_start: str) -> None:
    """One error that names the value (cut when long) and says which rule it breaks."""
    message = str(error)
    assert shown(value) in message and rule_start in message, message
    assert "\n" not in message.replace(shown(value), "")  # one line, whatever the value holds


# -- what is touched on disk --------------------------------------------------------------------------

_touched: list[str] | None = None
_EVENTS = {"open": (0,), "os.listdir": (0,), "os.scandir": (0,), "os.mkdir": (0,), "os.remove": (0,),
           "os.rmdir": (0,), "os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (1,),  # a link's target: its own
           "shutil.rmtree": (0,), "os.truncate": (0,), "os.chmod": (0,)}


def _audit(event: str, args: tuple) -> None:
    if _touched is not None and event in _EVENTS:
        for arg in (args[i] for i in _EVENTS[event]):
            # a relative name here is relative to a folder's fd (shutil.rmtree's walk), whose path has its own event
            if isinstance(arg, (str, bytes, os.PathLike)) and os.path.isabs(os.fsdecode(arg)):
                _touched.append(os.path.normpath(os.fsdecode(arg)))


sys.addaudithook(_audit)


@contextmanager
def touched():
    """Every path opened, listed, made, moved or removed inside the block (Python's audit events)."""
    global _touched
    _touched = seen = []
    try:
        yield seen
    finally:
        _touched = None


def outside(paths: list[str], *roots: Path) -> list[str]:
    """The paths that are in none of `roots` (imports of Python modules aside)."""
    homes = [os.path.realpath(r) for r in roots] + [sys.prefix, sys.base_prefix]
    return [p for p in paths if not p.endswith((".py", ".pyc", ".so"))
            and not any(os.path.realpath(p) == h or os.path.realpath(p).startswith(h + os.sep) for h in homes)]


# -- the rules ----------------------------------------------------------------------------------------


@pytest.mark.slow
@FUZZ
@given(repo_ids)
@example("org/name\n")  # `$` in a regex matches before a trailing newline
@example("org/café")  # `\w` is Unicode unless told otherwise
@examples("org/a--b", "org/a.git", "org/-a", "../x", "org/..", "/abs/x")
def test_a_repo_id_is_one_the_hub_accepts_or_a_clear_refusal(repo):
    try:
        check_repo_id(repo)
    except EnvNotFoundError as exc:
        refused_clearly(exc, repo, "is not a hub repo id: ")
        return
    validate_repo_id(repo)  # the client's own rules agree (it raises HFValidationError otherwise)
    owner, name = repo.split("/")
    assert owner not in (".", "..") and name not in (".", "..") and len(name) <= MAX_NAME


@pytest.mark.parametrize("repo", ["org/name-", "org/a..b", "org/x.git", "org/caf\u00e9", "org/x\n", "a" * 97 + "/b"])
def test_every_repo_id_the_hub_refuses_is_refused(repo):
    with pytest.raises(HFValidationError):
        validate_repo_id(repo)
    with pytest.raises(EnvNotFoundError, match="is not a hub repo id: "):
        check_repo_id(repo)


@pytest.mark.slow
@FUZZ
@given(names)
@examples("../x", "/etc", "a//b", "x\x00", "v1.lock", "a" * 256)
def test_a_revision_follows_git_ref_rules_or_is_refused_clearly(revision):
    try:
        check_revision(revision)
    except EnvNotFoundError as exc:
        refused_clearly(exc, revision, "is not a revision: ")
        return
    parts = revision.split("/")
    assert ".." not in revision and all(parts) and not any(p.startswith(".") for p in parts)
    assert revision.isprintable() and not any(c.isspace() for c in revision) and len(revision) <= 255


@pytest.mark.slow
@FUZZ
@given(names)
@examples("..", ".hidden", "a/b", "run\n", "")
def test_a_config_or_run_name_is_one_safe_folder_or_refused_clearly(name):
    for what in ("config name", "run name"):
        try:
            check_name(name, what)
        except EnvContractError as exc:
            refused_clearly(exc, name, f"is not a valid {what}: ")
            assert exc.where.field == what
            continue
        assert name not in (".", "..") and os.sep not in name and not set(name) & set(r'<>:/\|?*')  # datasets' rule
        assert (Path("/hub") / name).parent == Path("/hub")


@pytest.mark.slow
@FUZZ
@given(names)
@examples("../../etc/passwd", "/abs", "a/./b", "a\\b", "a\x00b")
def test_a_repo_path_stays_inside_its_repo(path):
    try:
        check_repo_path(path)
    except EnvContractError as exc:
        refused_clearly(exc, path, "is not a valid path in a repo")
        return
    assert os.path.normpath(os.path.join("/repo", path)).startswith("/repo/")


@pytest.mark.slow
@FUZZ
@given(names, names)
@examples(("main", "../../outside"), ("../x", "run"), ("main", "a\nb"))
def test_a_rollout_ref_checks_its_revision_and_run(revision, run):
    ref = f"org/rollouts@{revision}:{run}"
    try:
        repo, rev, name = parse_rollout_ref(ref)
    except HubgymError as exc:
        assert "is not a " in str(exc) or "empty revision" in str(exc)
        return
    check_revision(rev)
    assert name is None or check_name(name, "run name") == name


# -- the local hub: no revision leads out of its repo folder ------------------------------------------


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A local hub with one repo, and beside it a trap: what a revision that escaped its repo would find."""
    root = tmp_path_factory.mktemp("names")
    hub = LocalHub(root / "hub")
    hub.create_repo("org/r")
    hub.commit("org/r", {"hubgym.json": b"{}"}, "one")
    trap = root / "trap"  # a commit record and a snapshot outside the hub, as `<revision>.json` would find them
    (trap / "snapshots" / "x").mkdir(parents=True)
    (trap / "x.json").write_text('{"parent": null, "message": "trap", "date": "", "tree": {}}')
    hub.create_repo("org/other")
    return hub, root, trap


@pytest.mark.slow
@FUZZ
@given(names)
@example("PLACEHOLDER_ABSOLUTE")  # an absolute path to the trap, filled in below
@examples("../../other/refs/main", "../../../../trap/x", "%2e%2e%2f%2e%2e")
def test_no_local_revision_resolves_or_reads_outside_its_repo(local, revision):
    hub, root, trap = local
    if revision == "PLACEHOLDER_ABSOLUTE":
        revision = str(trap / "x")
    folder = hub.root / "datasets" / "org" / "r"
    with touched() as seen:
        try:
            snapshot = hub.resolve("org/r", revision)
        except HubgymError as exc:
            assert shown(revision) in str(exc)
        else:
            assert snapshot.path.resolve().parent == (folder / "snapshots").resolve()
        try:
            found = hub.exists("org/r", revision)
        except EnvNotFoundError as exc:
            assert "is not a revision: " in str(exc)
        else:
            assert found == (revision == "main")  # the only branch; no fuzzed name is a commit id of this repo
    assert outside(seen, hub.root) == []


def test_a_link_in_the_local_hub_that_leads_out_is_refused(tmp_path):
    hub = LocalHub(tmp_path / "hub")
    result = push_env("arithmetic", "org/arith", hub=hub, configs=["easy"],
                      overrides={"sizes": {"train": 2, "test": 1}})
    secret = tmp_path / "secret.py"
    secret.write_text("REWARDS = {}\n")
    snapshot = hub.resolve("org/arith").path
    (snapshot / "verifier.py").unlink()
    (snapshot / "verifier.py").symlink_to(secret)
    with pytest.raises(EnvContractError, match=r"verifier\.py leads outside its repo folder"):
        load_env(result.ref, hub=hub, trust=True)
    (snapshot / "verifier.py").unlink()
    (snapshot / "verifier.py").symlink_to(snapshot / "hubgym.json")
    with pytest.raises(EnvContractError, match=r"verifier\.py is a symbolic link; a local hub snapshot holds only"):
        load_env(result.ref, hub=hub, trust=True)
    head = hub.root / "datasets/org/arith/refs/main"
    os.chmod(head, 0o644)
    head.write_text("../../../../secret")
    with pytest.raises(EnvContractError, match=r"holds '\.\./\.\./\.\./\.\./secret', which is not a commit id"):
        hub.resolve("org/arith")


def test_hostile_names_never_reach_a_push(tmp_path):
    hub = LocalHub(tmp_path / "hub")
    for bad in ("org/x\n", "../evil", "org/..", "org/a/b"):
        with pytest.raises(EnvNotFoundError, match="is not a hub repo id"):
            push_env("arithmetic", bad, hub=hub, configs=["easy"])
    run = tmp_path / "run"
    (run / "shards").mkdir(parents=True)
    (run / "manifest-w000of001.json").write_text('{"run_id": "../../escape"}')
    (run / "shards" / "w000of001-00000.arrow").write_bytes(b"")
    with pytest.raises(EnvContractError, match=r"'\.\./\.\./escape' is not a valid run name: only ASCII"):
        push_rollouts(run, "org/rollouts", hub=hub)
    for name in ("..", "a/b", "x\n"):
        with pytest.raises(EnvContractError, match="is not a valid run name"):
            push_rollouts(run, "org/rollouts", hub=hub, name=name)
    assert not hub.root.exists() or not any(hub.root.rglob("*.arrow"))


# -- over HTTP: hostile revisions are refused or answered "not found" by the server ------------------


@pytest.mark.slow
@settings(FUZZ, max_examples=40)
@given(names)
@examples("../../../../../tmp/x", "%2e%2e%2f%2e%2e", "refs/pr/1", "\u00e9t\u00e9",
          "\uff0e\uff0e")  # fullwidth dots: ".." under NFKC, and not latin-1 (an error header must escape them)
def test_hostile_revisions_over_http_write_nothing_outside_the_cache(hub_client, tmp_path, monkeypatch, revision):
    hub_client.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub = HfHub(backoff_s=0.01)
    if not hub_client.store.exists("dataset", "org/r"):
        hub.create_repo("org/r")
    with touched() as seen:
        try:
            snapshot = hub.resolve("org/r", revision)
        except HubgymError as exc:
            assert shown(revision) in str(exc) or "no revision" in str(exc)
        else:
            assert revision in ("main", snapshot.revision[:len(revision)])
    written = [p for p in seen if not p.endswith((".py", ".pyc", ".so"))]
    assert outside(written, tmp_path) == []


def test_parse_ref_refuses_a_bad_revision_before_any_request():
    with pytest.raises(EnvNotFoundError, match=r"'\.\./x' is not a revision: '\.\.', '@\{' and a lone '@' are not"):
        parse_ref("org/a@../x")
    assert parse_ref("org/a@refs/pr/1") == ("org/a", "refs/pr/1")


@pytest.mark.slow
@FUZZ
@given(names)
@examples("../../../secret", "/etc/passwd", "shards/../../x", "a\x00b")
def test_stream_urls_of_stored_paths_stay_in_the_repo(local, path):
    """Rollout readers ask for `<run>/shards/<file>` with `file` read from a stored index.json: data, not code."""
    hub, _, _ = local
    snapshot = hub.resolve("org/r")
    try:
        [url], _ = hub.stream_urls(snapshot, [path])
    except EnvContractError as exc:
        assert shown(path) in str(exc) or "leads outside its repo folder" in str(exc)
        return
    assert snapshot.path.resolve() in Path(url).resolve().parents
    try:
        [remote], _ = HfHub(endpoint="http://127.0.0.1:9").stream_urls(snapshot, [path])
    except EnvContractError:
        raise AssertionError(f"{path!r}: the backends disagree")
    assert remote.endswith("/" + path) and ".." not in remote.split("/")
