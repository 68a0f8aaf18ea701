"""Bad input of `--ray`: no Ray installed, an address that does not answer, a node that does not see the run
folder, a worker that keeps dying. Each is one line, and none of them needs vLLM: each stops before an engine
starts. The clusters are real (tests/helpers/ray_cluster.py): a head on 127.0.0.1, and a second node under bubblewrap
whose view of the run folder's parent is an empty tmpfs, the layout of a node without the shared filesystem."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import astuple
from pathlib import Path

import pytest

from hubgym.cluster.ray_common import ClusterError, check_answers

HUBGYM = str(Path(sys.executable).with_name("hubgym"))
BASELINE = Path(__file__).parent / "broken_envs" / "baseline"


def hubgym(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([HUBGYM, *args], capture_output=True, text=True, timeout=timeout)


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


@pytest.mark.slow
def test_without_ray_installed_each_command_says_how_to_install_it(tiny_model, tmp_path):
    script = ("import sys; sys.modules['ray'] = None; from hubgym.cli import main; "
              "sys.argv = ['hubgym', *sys.argv[1:]]; main()")
    for args in (["rollout", "arithmetic:easy", "--model", str(tiny_model), "--out", str(tmp_path / "run"), "--ray"],
                 ["score", str(tmp_path), "--ray"]):
        done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and len(error_lines(done)) == 1, done.stderr
        assert "pip install 'hubgym[ray]'" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_an_address_where_nothing_listens_is_one_line_naming_it_and_how_to_check_it(tiny_model, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # closed again when the command runs: nothing listens
    done = hubgym("rollout", "arithmetic:easy", "--model", str(tiny_model), "--out", str(tmp_path / "run"), "--ray",
                  "--ray-address", address)
    assert done.returncode == 1 and len(error_lines(done)) == 1, done.stderr
    assert f"no Ray cluster answers at {address}" in done.stderr
    assert f"ray status --address {address}" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_an_address_that_listens_but_is_no_ray_cluster_is_refused_after_the_timeout():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(ClusterError, match=f"something listens at {address} but no Ray cluster answered "
                                               f"within 3 s; check it with `ray status --address {address}`"):
            check_answers(address, timeout_s=3)


@pytest.mark.slow
def test_a_node_that_does_not_see_the_run_folder_stops_the_run_with_one_line_naming_node_and_folder(
        cluster, tiny_model):
    data = Path(tempfile.mkdtemp(prefix="hgdata"))
    try:
        address = cluster.start_head(num_cpus=0)  # the worker can only run on the node below
        cluster.add_node(num_cpus=1, wrapper=["bwrap", "--dev-bind", "/", "/", "--tmpfs", str(data)])
        run = data / "run"
        done = hubgym("rollout", "arithmetic:easy", "--model", str(tiny_model), "--limit", "4", "--out", str(run),
                      "--ray", "--ray-address", address, "--workers", "1")
        assert done.returncode == 1 and len(error_lines(done)) == 1, done.stderr + cluster.logs()
        assert f"does not see the run folder {run} that the driver on {socket.gethostname()}" in done.stderr
        assert "a filesystem every node mounts at the same path" in done.stderr
        assert not list(run.glob("shards/*.arrow")) and not list(run.glob(".cluster-probe-*"))  # nothing written
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
def test_a_worker_that_keeps_dying_stops_the_run_with_one_line_naming_it(cluster, tiny_model, tmp_path):
    env = tmp_path / "dies"
    shutil.copytree(BASELINE, env)
    builder = env / "builder.py"
    builder.write_text(builder.read_text().replace(
        "    def generate_tasks(self, split, size, seed):\n",
        "    def generate_tasks(self, split, size, seed):\n        import os, signal\n"
        "        os.kill(os.getpid(), signal.SIGKILL)  # the process building the tasks dies, every time\n"))
    address = cluster.start_head(num_cpus=2)
    done = hubgym("rollout", str(env), "--model", str(tiny_model), "--out", str(tmp_path / "run"), "--ray",
                  "--ray-address", address, "--workers", "2")
    assert done.returncode == 1 and len(error_lines(done)) == 1, done.stdout + done.stderr + cluster.logs()
    assert "4 time(s) (Ray restarted it 3 times), so the run stops" in done.stderr
    assert "the same command resumes the run" in done.stderr
    assert any(f"worker w00{i}of002" in done.stderr for i in (0, 1))


@pytest.mark.slow
def test_a_verifier_file_a_node_lacks_is_written_from_the_drivers_bytes_and_hashes_the_same(tmp_path):
    from hubgym.cluster.ray_score import localized, verifier_sources
    from hubgym.score.choice import VerifierSpec
    from hubgym.verifiers.contract import load_verifier

    file = tmp_path / "echo_v2.py"
    file.write_text((BASELINE / "verifier.py").read_text() + "\n# v2\n")
    spec = VerifierSpec.of(load_verifier(str(file), env="baseline"), "baseline", "module")
    sources = verifier_sources({"baseline": spec})
    file.unlink()  # the node this runs on does not have it

    moved = localized({"baseline": spec}, sources)["baseline"]

    assert moved.path != spec.path and Path(moved.path).read_bytes() == sources[spec.path]
    loaded = subprocess.run(  # a fresh process, as on another node: the module is imported from the written file
        [sys.executable, "-c", "import sys; from hubgym.score.choice import VerifierSpec, load_verifier_of; "
                               "print(load_verifier_of(VerifierSpec(*sys.argv[1:])).sha256)", *astuple(moved)],
        capture_output=True, text=True, timeout=120)
    assert loaded.stdout.strip() == spec.sha256, loaded.stderr[-2000:]


@pytest.mark.slow
def test_a_cluster_that_asks_for_a_token_says_how_to_send_it(monkeypatch):
    """Ray's token authentication: a head that wants a token, a client without RAY_AUTH_MODE=token."""
    from helpers.ray_cluster import LocalRayCluster

    token = "0123456789abcdef" * 4
    cluster = LocalRayCluster(env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    try:
        address = cluster.start_head(num_cpus=1)
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        with pytest.raises(ClusterError, match=f"the Ray cluster at {address} asks for an authentication token.*"
                                               f"set RAY_AUTH_MODE=token"):
            check_answers(address, timeout_s=30)
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
        check_answers(address, timeout_s=30)  # with the token: it answers
    finally:
        cluster.stop()


FAILS_ONCE = """#!/bin/sh
# The first start gives up as Ray's own does when its raylet registers late on a loaded machine; later ones run.
if [ ! -e "$0.tried" ]; then touch "$0.tried"; echo "Exception: {message} This could happen ..."; exit 1; fi
exec "$@"
"""


@pytest.mark.slow
def test_a_test_cluster_node_whose_start_gives_up_early_is_started_again_and_other_failures_are_not(cluster, tmp_path):
    from helpers.ray_cluster import RAY_START_TOO_EARLY

    cluster.start_head(num_cpus=0)
    once = tmp_path / "fails-once"
    once.write_text(FAILS_ONCE.format(message=RAY_START_TOO_EARLY))
    once.chmod(0o755)
    cluster.add_node(num_cpus=1, wrapper=[str(once)])
    assert cluster.launched == 3 and len(cluster.nodes) == 2  # head, the try that gave up, the node that joined
    assert "Ray runtime started" in cluster.nodes[-1][1].read_text()

    always = tmp_path / "always-fails"
    always.write_text("#!/bin/sh\necho 'raylet: bad option'; exit 2\n")
    always.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"ray start failed \(try 1, 600 s allowed\):\nraylet: bad option"):
        cluster.add_node(num_cpus=1, wrapper=[str(always)])
