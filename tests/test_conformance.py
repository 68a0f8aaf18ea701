"""The conformance suite: good envs pass every check; the purity guard; prerequisites; tool schemas; the registry."""

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from hubgym.builders.registry import env_names
from hubgym.conformance import CHECKS, CheckResult, assert_env_ok, check_env, purity_guard
from hubgym.conformance.tools import schema_problem
from hubgym.conformance.context import Context
from hubgym.conformance.runner import iter_outcomes
from hubgym.errors import EnvContractError, ImpureVerifierError
from hubgym.tools import tool
from hubgym.tools.base import Tool
from hubgym.tools.registry import BUILTIN_TOOLS

ENVS = Path(__file__).parent / "broken_envs"
CHECK_NAMES = [c.__name__ for c in CHECKS]


def _copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(ENVS / name, tmp_path / name))


def _failures(results: list[CheckResult]) -> str:
    return "\n".join(r.message for r in results if not r.ok)


@pytest.mark.slow
def test_arithmetic_passes_every_check():
    results = check_env("arithmetic", max_rows=20)  # every check, on 20 scored rows a split
    assert [r.check for r in results] == CHECK_NAMES
    assert all(r.ok for r in results), _failures(results)
    assert all(r.message == "" and r.env == "arithmetic" and r.seconds >= 0 for r in results)
    assert_env_ok("arithmetic", configs=["easy"], max_rows=20)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["baseline", "baseline_mdp"])
def test_the_envs_the_broken_ones_derive_from_pass(name):
    results = check_env(str(ENVS / name))
    assert [r.check for r in results] == CHECK_NAMES and all(r.ok for r in results), _failures(results)


# Families (rg_*, ta_*: 100 envs) are checked whole by their own tests (tests/test_bridge_*.py).
@pytest.mark.slow
@pytest.mark.parametrize("name", env_names("builtin") + env_names("entry point"))
@pytest.mark.filterwarnings("ignore:.*shipped .* fixture:UserWarning")  # Hub data envs say they fell back
def test_every_registered_env_conforms(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # envs with Hub data build from their shipped fixture
    results = check_env(name, max_rows=10)
    assert all(r.ok for r in results), f"{name} fails conformance:\n{_failures(results)}"


@pytest.mark.slow
def test_check_result_is_a_frozen_record():
    result = check_env(str(ENVS / "baseline"))[0]
    assert [f.name for f in dataclasses.fields(CheckResult)] == ["env", "check", "ok", "message", "seconds", "skipped"]
    assert (result.env, result.check, result.ok) == ("baseline", "check_declaration", True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ok = False  # type: ignore[misc]


@pytest.mark.slow
@pytest.mark.parametrize("ref", ["arithmetic:easy", "rg_basic_arithmetic:easy"])
def test_env_colon_config_checks_that_config_as_configs_does(monkeypatch, ref):
    """ENV:CONFIG, the reference every command takes, checks that one config; the env is found by its name here and
    in the second process of the hash-seed check (which was handed the whole reference and failed to import it)."""
    import hubgym.conformance.context as context

    built, real = [], context.build_config
    monkeypatch.setattr(context, "build_config", lambda cls, config, *a, **k: built.append(config) or
                        real(cls, config, *a, **k))
    results = check_env(ref, max_rows=5, build_rows=8)
    assert [r.message for r in results if not r.ok] == [] and set(built) == {"easy"}
    with pytest.raises(EnvContractError, match=r"names config 'easy', but configs asks for \['medium'\]"):
        check_env(ref, configs=["medium"])


@pytest.mark.slow
def test_env_with_an_empty_config_after_the_colon_checks_its_default_configs():
    """"arithmetic:" names no config: the env's default configs are checked, and the hash-seed check's second
    process is handed the env, not the text with its colon (which it tried to import as a module)."""
    assert [r.message for r in check_env("arithmetic:", max_rows=5, build_rows=8) if not r.ok] == []


@pytest.mark.slow
def test_unknown_config_fails_the_declaration_check():
    results = {r.check: r for r in check_env("arithmetic", configs=["easy", "nope"], max_rows=5)}
    assert results["check_declaration"].message == (
        "check_declaration: unknown config 'nope'; the builder has ['easy', 'medium', 'hard', 'tiny', 'sums'] "
        "[env='arithmetic' config='nope']. Fix: ask for configs by one of the names in BUILDER_CONFIGS")
    assert all(r.ok for name, r in results.items() if name != "check_declaration")  # 'easy' is still checked


def test_max_rows_caps_the_scored_sample(tmp_path):
    ctx = Context(str(ENVS / "baseline"), None, 3, tmp_path)
    labels = [(s.split, s.label) for s in ctx.samples]
    # 3 rows of each split x (empty reply, generic reply, padded reply), then the 2 golden cases
    assert labels.count(("train", "the empty reply")) == 3 and labels.count(("test", "a generic reply")) == 3
    assert len(labels) == 2 * 3 * 3 + 2 and labels[-1] == (None, "golden case 'another word'")


@pytest.mark.slow
def test_a_failed_prerequisite_skips_what_needs_it(tmp_path):
    folder = _copy("baseline", tmp_path)
    (folder / "verifier.py").write_text("def correct(task):\n    return 1.0\nREWARDS = {correct: 1.0}\n")
    results = {r.check: r for r in check_env(str(folder))}
    assert results["check_verifier_loads"].message.startswith(
        "check_verifier_loads: REWARDS key <function correct at ")
    for name in ("check_golden_cases", "check_verifier_pure", "check_reward_range", "check_golden_replay"):
        assert results[name].message == (
            f"{name}: skipped: needs loading the verifier, which failed in check_verifier_loads [env='baseline']. "
            f"Fix: fix the check_verifier_loads failure first")
    assert all(results[n].ok for n in CHECK_NAMES[:CHECK_NAMES.index("check_verifier_loads")])  # tasks are fine
    with pytest.raises(EnvContractError, match="^check_verifier_loads: REWARDS key") as err:
        assert_env_ok(str(folder))  # the root cause, not a skip
    assert err.value.check == "check_verifier_loads"


def test_a_builder_that_does_not_import_fails_first_and_skips_the_rest(tmp_path):
    folder = _copy("baseline", tmp_path)
    (folder / "builder.py").write_text("import no_such_module_anywhere\n")
    results = check_env(str(folder))
    assert results[0].message.startswith("check_declaration: the builder failed to import: ModuleNotFoundError: "
                                         "No module named 'no_such_module_anywhere'")
    assert all(r.message.startswith(f"{r.check}: skipped: needs loading the builder, which failed in "
                                    "check_declaration") for r in results[1:])


def test_a_check_that_crashes_is_one_failure_not_a_crash(tmp_path):
    def check_boom(ctx):
        raise KeyError("oops")

    (result, error), = list(iter_outcomes(str(ENVS / "baseline"), checks=[check_boom]))
    assert not result.ok and isinstance(error.__cause__, KeyError)
    assert result.message.startswith("check_boom: the check itself crashed with KeyError: 'oops' [env='baseline']")


# -- the purity guard ------------------------------------------------------------------------------

def test_guard_blocks_writes_and_records_them_even_when_swallowed(tmp_path):
    target = tmp_path / "out.txt"
    with purity_guard() as violations:
        with pytest.raises(ImpureVerifierError, match="file write: open .*out.txt' mode 'w' is not allowed"):
            open(target, "w")
        try:
            os.remove(tmp_path)  # swallowed below: still recorded
        except ImpureVerifierError:
            pass
        assert (ENVS / "baseline" / "golden.jsonl").read_text().startswith("{")  # reading stays allowed
    assert [(v.kind, v.event) for v in violations] == [("file write", "open"), ("file write", "os.remove")]
    assert not target.exists()
    target.write_text("fine")  # outside the guard nothing is blocked
    assert target.read_text() == "fine"


def _bind_a_socket() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))


@pytest.mark.parametrize("action, kind", [
    (lambda: socket.create_connection(("127.0.0.1", 9), timeout=0.1), "network"),
    (lambda: _bind_a_socket(), "network"),
    (lambda: subprocess.run(["true"]), "process"),
    (lambda: os.system("true"), "process"),
    (lambda: shutil.rmtree("/nonexistent-hubgym-dir"), "file write"),
    (lambda: os.open(os.devnull, os.O_WRONLY), "file write"),
    (lambda: os.putenv("HUBGYM_PURITY_TEST", "1"), "environment"),
])
def test_guard_blocks_network_processes_and_filesystem_changes(action, kind):
    with purity_guard() as violations:
        with pytest.raises(ImpureVerifierError):
            action()
    assert violations[0].kind == kind


def test_guard_is_per_context_and_keeps_imports_working(tmp_path, monkeypatch):
    seen = {}

    def other_thread():
        (tmp_path / "thread.txt").write_text("other threads are not guarded")
        seen["wrote"] = True

    (tmp_path / "lazy_mod_for_guard.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = sys.dont_write_bytecode
    with purity_guard() as violations:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        import lazy_mod_for_guard  # a lazy import reads source and must not write a .pyc

        assert sys.dont_write_bytecode is True
    assert seen == {"wrote": True} and lazy_mod_for_guard.VALUE == 42 and violations == []
    assert not (tmp_path / "__pycache__").exists() and sys.dont_write_bytecode is before


# -- tool schemas ------------------------------------------------------------------------------------

@tool
def shout(text: str) -> str:
    """Repeat the text in capitals.

    Args:
        text: what to shout.
    """
    return text.upper()


def _register(monkeypatch, name: str, obj: object) -> None:
    module = types.ModuleType("hubgym_conformance_test_tools")
    module.entry = obj
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(BUILTIN_TOOLS, name, f"{module.__name__}:entry")


@pytest.mark.slow
def test_a_registered_tool_with_a_valid_schema_passes(monkeypatch):
    _register(monkeypatch, "no_such_tool", shout)  # the env's rows offer "no_such_tool"
    results = check_env(str(ENVS / "unknown_tool"))
    assert all(r.ok for r in results), _failures(results)


@pytest.mark.slow
def test_a_tool_without_description_fails_the_schema_check(monkeypatch):
    _register(monkeypatch, "no_such_tool", Tool("no_such_tool", "  ", shout.fn, shout.arguments))
    results = {r.check: r for r in check_env(str(ENVS / "unknown_tool"))}
    assert results["check_tool_schemas"].message == (
        "check_tool_schemas: the schema of tool 'no_such_tool' has an empty description (the model reads it to decide "
        "when to call the tool) [env='unknown_tool' field='test_conformance.py:shout']. Fix: define tools with "
        "@hubgym.tool on a typed function with a docstring (or a ToolSet method)")  # the file and function at fault


@pytest.mark.parametrize("schema, problem", [
    (shout.schema, None),
    ({"type": "object"}, "has type 'object', not 'function'"),
    ({"type": "function", "function": {"name": "has space", "description": "d", "parameters": {"type": "object"}}},
     "has name 'has space'; tool names are 1-64 letters, digits, '_' or '-'"),
    ({"type": "function", "function": {"name": "t", "description": "d", "parameters": {"type": "string"}}},
     "has parameters {'type': 'string'}, not a JSON-schema object"),
    ({"type": "function", "function": {"name": "t", "description": "d", "parameters": {"type": "object", "x": {1}}}},
     "is not JSON-serializable"),
])
def test_schema_problems_are_named(schema, problem):
    found = schema_problem(schema)
    assert found == problem if problem is None else found.startswith(problem)


@pytest.mark.slow
def test_build_rows_caps_every_build_of_a_check(tmp_path):
    """`hubgym check all` builds each split with at most --max-rows rows (its default 50): the first, second and
    hash-seed builds alike, so the determinism checks compare like with like."""
    ctx = Context("arithmetic", ["easy"], 3, tmp_path, build_rows=5)
    assert {split: len(table) for split, table in ctx.build("easy").items()} == {"train": 5, "test": 5}
    assert {split: len(table) for split, table in ctx.build("easy", 2).items()} == {"train": 5, "test": 5}
    assert {split: len(table) for split, table in ctx.hash_seed_build("easy").items()} == {"train": 5, "test": 5}
    assert [r.check for r in check_env("arithmetic", configs=["easy"], max_rows=3, build_rows=5) if r.failed] == []


@pytest.mark.slow
@pytest.mark.timeout(180)  # the old second process never answered such a builder: the check waited forever
def test_a_builder_that_prints_without_a_newline_passes_the_hash_seed_check(tmp_path):
    """Whatever a builder prints (reasoning-gym's bf compiler prints dots with no newline; a C extension may write
    to file descriptor 1) stays out of the answers of the process that builds it under another hash seed."""
    env = tmp_path / "chatty"
    shutil.copytree(Path(__file__).parent / "broken_envs" / "baseline", env)
    builder = env / "builder.py"
    source = builder.read_text().replace('ENV = "baseline"', 'ENV = "chatty"')
    builder.write_text(source.replace("        for word in", "        print('.', end='')\n"
                                      "        os.write(1, b'..')\n        for word in").replace(
        "import random", "import os\nimport random"))
    results = check_env(str(env))
    assert {r.check: r.ok for r in results}["check_rows_independent_of_hash_seed"]
    assert [r.check for r in results if r.failed] == []
