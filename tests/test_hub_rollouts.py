"""Rollout runs on a hub (a local hub folder, and the real huggingface_hub client over HTTP to the loopback
Hub-API server): push real vLLM runs, two runs as two configs, read them back through `datasets` and through
hubgym's reader, resume an interrupted push, refuse a truncated shard, name a corrupted one, hub env refs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.errors import HubConnectionError, ShardError, SkippedShardsWarning, VerifierNotTrustedError
from hubgym.hub import HfHub, LocalHub
from hubgym.envs import push_env
from hubgym.hub.factory import get_hub
from hubgym.hub.rollouts import iter_batches, iter_rollouts, open_rollouts, push_rollouts
from hubgym.files import sha256_file
from hubgym.engines import SamplingArgs
from hubgym.rollout import RolloutConfig, run_rollouts
from hubgym.score.rescore import rescore

from helpers.hub_server import TOKEN
from helpers.scored_runs import make_run

pytestmark = [pytest.mark.slow,  # its fixtures sample runs with vLLM
              pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


ANSWER = r"<answer>[0-9]{1,2}</answer>"  # constrained replies: some right, some wrong, all scored


@pytest.fixture(scope="module")
def engine(tiny_model):
    from hubgym.engines import VLLMEngine

    engine = VLLMEngine(str(tiny_model), max_model_len=512)
    yield engine
    engine.close()


def rollout_config(tiny_model, out, seed: int = 0, **kw) -> RolloutConfig:
    """arithmetic:easy, 4 tasks x 2 samples, one group (2 rows) per shard: 8 rollouts in 4 shards."""
    return RolloutConfig(**{"envs": ["arithmetic:easy"], "model": str(tiny_model), "out": str(out), "n": 2,
                            "limit": 4, "sampling": SamplingArgs(max_tokens=8, seed=seed, regex=ANSWER),
                            "max_model_len": 512, "max_rows_per_shard": 2, **kw})


@pytest.fixture(scope="module")
def real_runs(engine, tiny_model, tmp_path_factory) -> dict[int, Path]:
    """Two real runs (vLLM, the tiny model), seeds 0 and 1: two run ids. Tests copy them before changing them."""
    root = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        assert run_rollouts(rollout_config(tiny_model, root / f"seed{seed}", seed), engine=engine,
                            progress=False).written == 8
    return {seed: root / f"seed{seed}" for seed in (0, 1)}


def copy_run(run: Path, tmp_path: Path, name: str = "run") -> Path:
    return Path(shutil.copytree(run, tmp_path / name))


def run_id(run: Path) -> str:
    return json.loads(next(run.glob("manifest-*.json")).read_text())["run_id"]


@pytest.fixture
def http_hub(hub_client, tmp_path, monkeypatch):
    hub_client.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return HfHub(backoff_s=0.01)  # the client's default cache (HF_HUB_CACHE, set by hub_client): links into blobs/


@pytest.fixture(params=["local", "http"])
def hub(request, tmp_path):
    return get_hub(tmp_path / "hub") if request.param == "local" else request.getfixturevalue("http_hub")


def ids(rows) -> list[str]:
    return sorted(r["rollout_id"] for r in rows)


def by_id(rows) -> dict[str, dict]:
    return {r["rollout_id"]: r for r in rows}


def load_config(hub, run: str, tmp_path):
    """`datasets.load_dataset(REPO, RUN, streaming=True)`: by repo id over HTTP, or the local hub's snapshot."""
    if isinstance(hub, HfHub):
        return datasets.load_dataset("org/rollouts", run, split="train", streaming=True, token=TOKEN,
                                     cache_dir=str(tmp_path / "ds"))
    return datasets.load_dataset(str(hub.resolve("org/rollouts").path), run, split="train", streaming=True)


def blob_of(hub, request, path: str) -> Path:
    """The stored bytes of a repo file at the head, on the server (http) or in the local hub, made writable."""
    if isinstance(hub, HfHub):
        index = json.loads((hub.resolve("org/rollouts").path / path.split("/")[0] / "index.json").read_text())
        sha = index["shards"][path.rsplit("/")[-1]]["sha256"]
        blob = request.getfixturevalue("hub_server").store.root / "blobs" / sha
    else:
        blob = hub.resolve("org/rollouts").path / path
    os.chmod(blob, 0o644)
    return blob


def test_the_writer_records_each_shards_rows_and_sha256(real_runs):
    manifest = json.loads(next(real_runs[0].glob("manifest-*.json")).read_text())
    shards = sorted((real_runs[0] / "shards").glob("*.arrow"))
    assert len(shards) == 4 and manifest["shards"] == [p.name for p in shards]
    assert manifest["shard_files"] == {p.name: {"rows": 2, "sha256": sha256_file(p)} for p in shards}


def test_push_two_runs_then_read_them_back_every_way(hub, real_runs, tmp_path):
    a, b = real_runs[0], real_runs[1]
    first = push_rollouts(a, "org/rollouts", hub=hub, batch_bytes=1)  # one shard per commit
    assert (first.name, first.rows, first.uploaded, first.skipped, first.commits) == (run_id(a), 8, 4, 0, 5)
    second = push_rollouts(b, "org/rollouts", hub=hub, name="second")
    assert (second.rows, second.uploaded, second.commits) == (8, 4, 2)  # all 4 shards in one commit, then the card
    again = push_rollouts(a, "org/rollouts", hub=hub)
    assert (again.uploaded, again.skipped, again.commits, again.revision) == (0, 4, 0, second.revision)

    card = (hub.resolve("org/rollouts").path / "README.md").read_text()
    assert f"config_name: {first.name}" in card and "config_name: second" in card  # the first run's config kept
    local = {first.name: by_id(iter_rollouts(a)), "second": by_id(iter_rollouts(b))}
    for run, rows in local.items():
        rewards = [r["reward"] for r in rows.values()]
        mean = f"{sum(rewards) / len(rewards):.3f}"
        assert re.search(rf"\| `arithmetic` \| easy \| built-in \| `hubgym\.verifiers\.arithmetic` .*\| 8 \| 4 \| "
                         rf"{mean} \|", card.split(f"## Run `{run}`")[1]), card
        assert str(Path(rows[next(iter(rows))]["provenance"]["model"])) in card
        assert by_id(iter_rollouts(f"org/rollouts:{run}", hub=hub)) == rows  # hubgym's reader, from the hub
        assert by_id(open_rollouts(f"org/rollouts:{run}", hub=hub)) == rows  # a datasets IterableDataset
        assert by_id(load_config(hub, run, tmp_path)) == rows  # plain datasets, from the card's YAML
    assert by_id(iter_rollouts(first.ref, hub=hub)) == local[first.name]  # the revision it was pushed at
    assert len(ids(iter_rollouts("org/rollouts", hub=hub))) == 16  # every run of the repo
    batches = list(iter_batches("org/rollouts:second", hub=hub))
    assert [b.num_rows for b in batches] == [2, 2, 2, 2]
    table = open_rollouts(a, streaming=False)  # a datasets Dataset from a run folder
    assert len(table) == 8 and by_id(table) == local[first.name]


class FlakyHub(LocalHub):
    """A real local hub whose commit number `fail_at` fails as a dropped connection would (fault injection)."""

    def __init__(self, root, fail_at: int):
        super().__init__(root)
        self.fail_at, self.calls = fail_at, 0

    def commit(self, repo, files, message, *, replace=False):
        self.calls += 1
        if self.calls == self.fail_at:
            raise HubConnectionError("cannot push: connection dropped (injected)")
        return super().commit(repo, files, message, replace=replace)


def test_an_interrupted_push_resumes_with_no_duplicate(hub, real_runs, request, tmp_path):
    run = real_runs[0]
    if isinstance(hub, HfHub):
        request.getfixturevalue("hub_client").drop("commit", 100, skip=2)  # 2 commits land, then every try drops
        flaky = hub
    else:
        flaky = FlakyHub(hub.root, fail_at=3)
    with pytest.raises(HubConnectionError):
        push_rollouts(run, "org/rollouts", hub=flaky, batch_bytes=1)
    name = run_id(run)
    partial = list(iter_rollouts(f"org/rollouts:{name}", hub=hub))  # what landed is whole and readable
    assert len(partial) == 4 and f"config_name: {name}" not in _card(hub)
    if isinstance(hub, HfHub):
        request.getfixturevalue("hub_client").faults.clear()  # the Hub is back
    done = push_rollouts(run, "org/rollouts", hub=hub, batch_bytes=1)
    assert (done.skipped, done.uploaded, done.rows) == (2, 2, 8)
    rows = list(iter_rollouts(f"org/rollouts:{name}", hub=hub))
    assert ids(rows) == ids(iter_rollouts(run)) and len(set(ids(rows))) == 8
    assert ids(load_config(hub, name, tmp_path)) == ids(rows)  # no duplicate file either
    files = [p for p in hub.resolve("org/rollouts").path.rglob("*.arrow")]
    assert len(files) == 4


def _card(hub) -> str:
    path = hub.resolve("org/rollouts").path / "README.md"
    return path.read_text() if path.is_file() else ""


def test_a_bad_shard_is_never_published(hub, real_runs, tmp_path):
    run = copy_run(real_runs[0], tmp_path)
    shards = sorted((run / "shards").glob("*.arrow"))
    good = shards[1].read_bytes()
    shards[1].write_bytes(good[: len(good) // 2])  # a partial write
    with pytest.raises(ShardError, match=r"shard .*w000of001-00001\.arrow is truncated or corrupted"):
        push_rollouts(run, "org/rollouts", hub=hub)
    assert not hub.exists("org/rollouts")  # refused before anything was sent
    shards[1].write_bytes(shards[0].read_bytes())  # a whole shard, but not the one the writer wrote
    with pytest.raises(ShardError, match=r"w000of001-00001\.arrow changed after it was written: its sha256 is "):
        push_rollouts(run, "org/rollouts", hub=hub)
    shards[1].write_bytes(good)
    assert push_rollouts(run, "org/rollouts", hub=hub).uploaded == 4


def test_a_corrupted_shard_is_named_on_read_and_the_rest_is_readable(hub, real_runs, request, tmp_path):
    run = real_runs[0]
    name = push_rollouts(run, "org/rollouts", hub=hub).name
    bad = f"{name}/shards/w000of001-00002.arrow"
    blob = blob_of(hub, request, bad)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: Arrow may still open it, its sha256 differs
    blob.write_bytes(bytes(data))
    in_bad = set(ids(iter_rollouts(run / bad.split("/", 1)[1])))
    expected = [r for r in iter_rollouts(run) if r["rollout_id"] not in in_bad]
    for read in (lambda **kw: list(iter_rollouts(f"org/rollouts:{name}", hub=hub, **kw)),
                 lambda **kw: list(open_rollouts(f"org/rollouts:{name}", hub=hub, **kw))):
        with pytest.raises(ShardError, match=rf"^shard {re.escape(bad)} is corrupted: its sha256 is [0-9a-f]{{64}}, "):
            read()
        said = rf"skipped 1 bad shard\(s\) .*: {re.escape(bad)} \(shard .* is corrupted"  # what broke, in brackets
        with pytest.warns(SkippedShardsWarning, match=said):
            rest = read(skip_bad=True)
        assert ids(rest) == ids(expected) and len(rest) == 6


def test_a_truncated_shard_in_a_run_folder_is_detected_on_read(real_runs, tmp_path):
    run = copy_run(real_runs[0], tmp_path)
    shard = sorted((run / "shards").glob("*.arrow"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])  # no footer
    with pytest.raises(ShardError, match=rf"{re.escape(shard.name)} is corrupted: its sha256 is"):
        list(iter_rollouts(run))  # the manifest's sha256
    next(run.glob("manifest-*.json")).unlink()  # nothing recorded: Arrow itself refuses it
    with pytest.raises(ShardError, match=rf"{re.escape(shard.name)} is truncated or corrupted \(ArrowInvalid"):
        list(iter_rollouts(run))
    counts: dict = {}
    with pytest.warns(SkippedShardsWarning, match=r"skipped 1 bad shard\(s\) \(of 4 in this read\)"):
        rest = list(iter_rollouts([run], skip_bad=True, counts=counts))
    assert len(rest) == 6 and counts == {"bad_shards": 1, "shards": 3, "rows": 6}


def test_rollouts_of_a_hub_env_record_its_repo_and_resolved_revision(hub_spec, engine, tiny_model, tmp_path):
    pushed = push_env("arithmetic", "org/arith", hub=hub_spec, configs=["easy"],
                      overrides={"sizes": {"train": 4, "test": 4}})
    sha = pushed.manifest["code"]["sha256"]
    with pytest.raises(VerifierNotTrustedError, match=f"Its sha256 is {sha}"):  # neither pinned nor trusted
        run_rollouts(rollout_config(tiny_model, tmp_path / "refused", envs=["org/arith:easy"], hub=hub_spec),
                     engine=engine, progress=False)
    assert not (tmp_path / "refused").exists()  # refused before any generation
    out = tmp_path / "run"
    config = rollout_config(tiny_model, out, envs=["org/arith:easy"], hub=hub_spec,
                            pins={"org/arith": f"sha256:{sha}"})  # no @revision: the head, resolved to its commit
    assert run_rollouts(config, engine=engine, progress=False).written == 8
    rows = list(iter_rollouts(out))
    assert {(r["provenance"]["env_repo"], r["provenance"]["env_revision"]) for r in rows} == {
        ("org/arith", pushed.revision)}
    assert {r["provenance"]["verifier_sha256"] for r in rows} == {pushed.manifest["verifier"]["sha256"]}
    assert {r["provenance"]["env_code_sha256"] for r in rows} == {sha}  # the pin: what score and replay need
    result = push_rollouts(out, "org/rollouts", hub=hub_spec)
    card = (get_hub(hub_spec).resolve("org/rollouts").path / "README.md").read_text()
    assert f"`org/arith@{pushed.revision}`" in card and result.rows == 8


def test_cli_push_rollouts_and_its_errors(http_hub, hub_server, real_runs, monkeypatch):
    runner = CliRunner()
    done = runner.invoke(app, ["push-rollouts", str(real_runs[0]), "org/rollouts", "--hub", hub_server.url,
                               "--name", "cli"], env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    assert re.search(r"8 rollouts in 4 new shard\(s\) \(0 already there\) -> org/rollouts@[0-9a-f]{40}:cli",
                     done.output)
    wrong = "hf_wrongTokenThatMustNotShow987"
    refused = runner.invoke(app, ["push-rollouts", str(real_runs[1]), "org/rollouts", "--hub", hub_server.url],
                            env={"COLUMNS": "300", "HF_TOKEN": wrong})
    assert refused.exit_code == 1 and "refused the token from HF_TOKEN" in refused.output
    assert wrong not in refused.output and TOKEN not in refused.output
    missing = runner.invoke(app, ["push-rollouts", str(real_runs[0] / "shards"), "org/rollouts", "--hub",
                                  hub_server.url])
    assert missing.exit_code == 1 and "is not a rollout run folder" in missing.output


def test_cli_rollout_push_runs_then_pushes(tiny_model, tmp_path):
    """The installed `hubgym rollout ... --push REPO` (its own vLLM engine, in a subprocess)."""
    script = Path(sys.executable).with_name("hubgym")
    hub_dir, out = tmp_path / "hub", tmp_path / "run"
    done = subprocess.run([script, "rollout", "arithmetic:easy", "--model", tiny_model, "--n", "2", "--limit", "2",
                           "--max-tokens", "8", "--max-model-len", "512", "--out", out, "--hub", hub_dir,
                           "--push", "org/rollouts"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ref = re.search(r"-> (org/rollouts@[0-9a-f]{40}:[0-9a-f]{12})", done.stdout).group(1)
    assert ids(iter_rollouts(ref, hub=hub_dir)) == ids(iter_rollouts(out)) and len(ids(iter_rollouts(out))) == 4


def test_rescore_from_the_hub_with_a_changed_verifier(hub, tmp_path):
    run = make_run(tmp_path / "run", "runa")
    pushed = push_rollouts(run, "org/rollouts", hub=hub)
    same = rescore([pushed.ref], hub=hub, workers=1)
    assert (same.rows, same.changed) == (12, 0)
    changed_verifier = tmp_path / "arith_v2.py"
    changed_verifier.write_text(
        "from hubgym.verifiers.arithmetic import formatted\n"
        "def lenient(task, completion):\n    return 1.0\n"
        "REWARDS = {lenient: 1.0}\nBATCH_REWARDS = {formatted: 0.0}\nREWARD_RANGE = (0.0, 1.0)\n")
    result = rescore([pushed.ref], hub=hub, verifier=str(changed_verifier), workers=2, out=tmp_path / "v2")
    assert result.changed == 6  # every wrong answer now scores 1
    total = result.diff.filter(result.diff["component"] == "*").row(0, named=True)
    assert (total["changed"], total["mean_old"], total["mean_new"]) == (6, 0.5, 1.0)
    assert set(result.diff["component"]) == {"*", "answer_found", "correct", "formatted", "lenient"}
    written = list(iter_rollouts([tmp_path / "v2"]))
    assert {r["rescore_reward"] for r in written} == {1.0} and {r["reward"] for r in written} == {0.0, 1.0}
    assert all(r["rescore_verifier_module"] and json.dumps(r["info"]) for r in written)


def test_rescore_of_a_hub_run_on_a_ray_cluster_gives_what_one_machine_gives(cluster, http_hub, hub_server, tmp_path):
    """`hubgym score REF --ray`: a hub run is streamed by the driver and its batches go to Ray tasks as Arrow bytes
    (no shared filesystem), a changed verifier file shipped with them; the report and the output shards are those
    of a re-score on one machine."""
    address = cluster.start_head(num_cpus=2)
    pushed = push_rollouts(make_run(tmp_path / "run", "runa", groups=12), "org/rollouts", hub=http_hub)
    verifier = tmp_path / "elsewhere" / "arith_v2.py"  # Ray's workers run in other folders: found by its bytes
    verifier.parent.mkdir()
    verifier.write_text("from hubgym.verifiers.arithmetic import formatted\n"
                        "def lenient(task, completion):\n    return 1.0\n"
                        "REWARDS = {lenient: 1.0}\nBATCH_REWARDS = {formatted: 0.0}\nREWARD_RANGE = (0.0, 1.0)\n")
    script = Path(sys.executable).with_name("hubgym")

    def score(out: Path, *ray: str) -> subprocess.CompletedProcess:
        return subprocess.run([script, "score", pushed.ref, "--hub", hub_server.url, "--verifier", str(verifier),
                               "--out", str(out), *ray], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "COLUMNS": "200"})

    here, there = score(tmp_path / "one"), score(tmp_path / "ray", "--ray", "--ray-address", address)
    assert here.returncode == 0 and there.returncode == 0, here.stdout[-2000:] + there.stdout[-3000:] + there.stderr
    assert "what changed: 12 of 24" in " ".join(there.stdout.split())  # every wrong answer now scores 1
    tables = [[line.replace(str(out), "OUT") for line in done.stdout.splitlines() if "rows/s" not in line]
              for done, out in ((here, tmp_path / "one"), (there, tmp_path / "ray"))]
    assert tables[0] == tables[1]
    manifests = [json.loads((tmp_path / side / "manifest-w000of001.json").read_text()) for side in ("one", "ray")]
    assert manifests[0]["rescore"]["counts"] == manifests[1]["rescore"]["counts"]
    assert manifests[0]["shard_files"] == manifests[1]["shard_files"]  # the same bytes, shard by shard
    assert {r["rescore_reward"] for r in iter_rollouts([tmp_path / "ray"])} == {1.0}
