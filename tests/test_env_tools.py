"""An env's own tools travel with it: a tools module beside the builder, checked, pushed under the env's one pin,
and loaded from the hub revision itself (nothing to install), on every path that runs or reads the env."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess

import pytest

from hubgym.envs import load_env, open_env, push_env
from hubgym.errors import ToolNotFoundError, VerifierNotTrustedError
from hubgym.hub import LocalHub
from hubgym.hub.trust import code_sha256
from hubgym.authoring.scaffold import scaffold_env
from hubgym.schemas import assistant, tool_call
from hubgym.tools.registry import make_toolbox

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # huggingface_hub's LFS upload
SMALL = {"sizes": {"train": 6, "test": 3}}


@pytest.fixture
def units(tmp_path):
    """`hubgym init units --kind tool_use`: an env whose rows offer its own `convert` tool."""
    return scaffold_env("units", tmp_path / "envs", kind="tool_use")


@pytest.fixture
def pushed(units, tmp_path):
    hub = LocalHub(tmp_path / "hub")
    return hub, push_env(str(units), "org/units", hub=hub, overrides=SMALL)


def test_a_local_env_offers_its_own_tool_and_the_loop_runs_it(units):
    env = open_env(str(units))
    task = env.take("test", 1)[0]
    assert task["interaction"]["tools"] == ["convert"] and set(env.verifier.tools.tools) == {"convert"}
    box = make_toolbox(task["interaction"]["tools"], task, env.verifier.tools)
    assert box.schemas()[0]["function"]["parameters"]["properties"]["to_unit"]["description"].startswith("the unit")
    out = box.call(tool_call("c1", "convert", json.dumps({"value": 3.5, "from_unit": "km", "to_unit": "m"})))
    assert out.error is None and out.message["content"] == "3500"
    bad = box.call(tool_call("c2", "convert", json.dumps({"value": 1, "from_unit": "km", "to_unit": "yd"})))
    assert bad.message["content"].startswith("Error: ValueError: unknown unit 'yd'")


def test_push_uploads_the_tools_and_one_pin_covers_every_code_file(pushed, units):
    hub, result = pushed
    snapshot = hub.resolve("org/units", result.revision)
    assert (snapshot.path / "tools.py").read_bytes() == (units / "tools.py").read_bytes()
    files = {name: hashlib.sha256((units / name).read_bytes()).hexdigest() for name in ("tools.py", "verifier.py")}
    manifest = result.manifest
    assert manifest["code"] == {"files": {"verifier.py": files["verifier.py"], "tools.py": files["tools.py"]},
                                "sha256": code_sha256(files)}
    assert manifest["tools_module"]["path"] == "tools.py" and manifest["tools_module"]["sha256"] == files["tools.py"]
    listing = subprocess.run(["sha256sum", "tools.py", "verifier.py"], cwd=snapshot.path, capture_output=True,
                             check=True).stdout
    assert hashlib.sha256(listing).hexdigest() == manifest["code"]["sha256"]  # what the README says to run
    python, cli = result.load_hints()
    assert python.count("sha256:") == 1 and f"--pin org/units=sha256:{manifest['code']['sha256']}" in cli
    card = (snapshot.path / "README.md").read_text()
    assert "`tools.py`" in card and f"sha256:{manifest['code']['sha256']}" in card


def test_a_pinned_hub_env_loads_its_tools_from_the_revision(pushed):
    hub, result = pushed
    env = load_env(result.ref, hub=hub, pin=f"sha256:{result.manifest['code']['sha256']}", split="test")
    convert = env.verifier.tools.tools["convert"]
    assert convert.fn(value=2.0, from_unit="m", to_unit="cm") == "200"
    assert env.verifier.tools.sha256 == result.manifest["tools_module"]["sha256"]
    assert env.take("test", 2)[0]["interaction"]["tools"] == ["convert"]  # resolves: nothing installed


def test_a_pin_of_the_verifier_alone_or_a_tampered_tools_module_is_refused(pushed, tmp_path):
    hub, result = pushed
    verifier_only = result.manifest["code"]["files"]["verifier.py"]
    with pytest.raises(VerifierNotTrustedError, match=r"not running the code of org/units@[0-9a-f]{40} \(verifier.py, "
                                                      r"tools.py\): its sha256 is [0-9a-f]{64}, but the pin is"):
        open_env(result.ref, hub=hub, pin=f"sha256:{verifier_only}")
    marker = tmp_path / "ran"
    hub.commit("org/units", {"tools.py": f"open({str(marker)!r}, 'w').write('ran')\n".encode()}, "edit by hand")
    with pytest.raises(VerifierNotTrustedError, match=r"records sha256 [0-9a-f]{64} for tools.py, but the file has "
                                                      r"sha256 [0-9a-f]{64}, so the repo was edited by hand"):
        open_env("org/units", hub=hub, trust=True)
    assert not marker.exists()


def test_a_row_offering_a_tool_no_one_provides_says_where_tools_come_from(units):
    builder = units / "builder.py"
    builder.write_text(builder.read_text().replace('    TOOLS_MODULE = "tools.py"', '    TOOLS_MODULE = None'))
    env = open_env(str(units))
    with pytest.raises(ToolNotFoundError) as caught:
        env.take("test", 1)
    message = str(caught.value)
    assert re.match(r"no tool named 'convert' in env 'units'.s tools module \(none\), hubgym's built-in tools or the "
                    r"installed 'hubgym.tools' entry points \(known: calculator, python, retail\)\. An env ships its "
                    r"own tools in its folder \(tools.py, named by the builder's TOOLS_MODULE; `hubgym push` uploads "
                    r"it\); a package can register one in the 'hubgym.tools' entry-point group \[env='units' "
                    r"config='default' split='test' row='units-[0-9a-f]{16}' field='interaction.tools'\]$", message)


def test_the_scaffolded_tool_env_scores_its_golden_cases_with_the_explicit_success_threshold(units):
    verifier = open_env(str(units)).verifier
    assert verifier.reward_range == (0.0, 1.1) and verifier.success_threshold == 1.0
    cases = {case.name: case for case in open_env(str(units)).golden_cases()}
    without_tool = verifier.score(cases["correct without the tool"].task, cases["correct without the tool"].completion)
    assert without_tool.reward == 1.0 and verifier.succeeded(without_tool)
    untagged = verifier.score(cases["the number without the tag"].task, [assistant("It is 3500 m.")])
    assert untagged.reward == 0.0 and untagged.components["answer_found"] == 0.0


ROLLOUT_SCRIPT = '''
import re, sys
from hubgym.rollout import RolloutConfig, run_rollouts
from hubgym.engines import SamplingArgs

ref, pin, hub, model, out = sys.argv[1:]
CALL = ('<tool_call>\\n{"name": "convert", "arguments": {"value": 3.5, "from_unit": "km", "to_unit": "m"}}'
        '\\n</tool_call>')
if __name__ == "__main__":  # every reply is forced to call the env's own tool (vLLM structured outputs)
    config = RolloutConfig(envs=[ref], model=model, out=out, n=2, limit=2, max_model_len=1024, hub=hub,
                           pins={"org/units": pin}, sampling=SamplingArgs(max_tokens=160, regex=re.escape(CALL)))
    print("rows", run_rollouts(config, progress=False).written)
'''


@pytest.mark.slow
def test_a_user_pulls_a_tool_env_over_http_and_rolls_out_scores_and_replays_it_with_nothing_installed(
        units, hub_client, tiny_model, tmp_path):
    """The env folder is not on the user's machine: a fresh process, elsewhere, with no PYTHONPATH, reads the env
    from the Hub-API server (the client's default cache: links into blobs/) and runs its tool in the rollout loop;
    `hubgym score` and `hubgym replay` (token audit over the env's tool schemas) read it the same way."""
    from typer.testing import CliRunner

    from hubgym.cli import app
    from hubgym.hub.rollouts import iter_rollouts

    url = hub_client.url
    pushed = CliRunner().invoke(app, ["push", str(units), "org/units", "--hub", url], env={"COLUMNS": "400"})
    assert pushed.exit_code == 0, pushed.output
    ref, pin = re.search(r"hubgym rollout (org/units@[0-9a-f]{40}) --pin org/units=(sha256:[0-9a-f]{64})",
                         pushed.output).groups()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fresh = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}

    def run(*command: str) -> str:
        done = subprocess.run(command, cwd=elsewhere, env=fresh, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    script = elsewhere / "roll.py"
    script.write_text(ROLLOUT_SCRIPT)
    import sys

    assert "rows 4" in run(sys.executable, str(script), ref, pin, url, str(tiny_model), "run")
    rows = list(iter_rollouts(elsewhere / "run"))
    tool_messages = [m for r in rows for m in r["completion"] if m["role"] == "tool"]
    assert tool_messages and {m["name"] for m in tool_messages} == {"convert"}, [
        (r["finish_reason"], r["completion"][:2]) for r in rows]
    assert {m["content"] for m in tool_messages} == {"3500"}  # the env's own tool ran, from the hub's bytes
    assert all(r["error"] is None and r["tokens_consistent"] for r in rows)
    assert {m["value"] for r in rows for m in r["metrics"] if m["name"] == "reward/tool_calls"} == {0.1}  # shaping
    snapshot = next(p for p in (tmp_path / "hf-hub-cache").rglob("tools.py"))
    assert snapshot.is_symlink() and "blobs" in str(snapshot.resolve())  # read through the cache's link
    hubgym = str(__import__("pathlib").Path(sys.executable).with_name("hubgym"))
    refused = subprocess.run([hubgym, "replay", "run", "--hub", url, "--model", str(tiny_model)], cwd=elsewhere,
                             env=fresh, capture_output=True, text=True, timeout=300)  # the rows choose no code
    printed = re.search(r"then run: (hubgym replay run .*)$", refused.stderr.strip())
    assert refused.returncode == 1 and printed, refused.stderr
    assert printed.group(1) == f"hubgym replay run --env-revision {ref} --pin org/units={pin} --hub {url}"
    scored = run(hubgym, "score", "run", "--env-revision", ref, "--pin", f"org/units={pin}", "--hub", url,
                 "--out", "rescored")
    assert "what changed: 0 of 4 rows" in scored
    replayed = run(hubgym, "replay", "run", "--env-revision", ref, "--pin", f"org/units={pin}", "--hub", url,
                   "--model", str(tiny_model))
    assert "token audit skipped" not in replayed  # exit code 0: no row diverged, every row's tokens re-rendered
