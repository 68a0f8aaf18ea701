"""The catalog at scale: a 1500-env family lists, filters and resolves; a broken family is one row, never fatal;
`hubgym check` over many envs runs in parallel, gives the same results at any --jobs, and turns a hang or a crash
into one failure row."""

import dataclasses
import json
import os
import re
import shutil
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hubgym.builders import registry
from hubgym.builders.families import FamilyEnv, write_index
from hubgym.envs import resolve_env
from hubgym.envs.catalog import catalog
from hubgym.cli import app
from hubgym.conformance import CHECKS
from hubgym.conformance.parallel import check_many, default_jobs
from hubgym.errors import EnvNotFoundError

ENVS = Path(__file__).parent / "broken_envs"
SIZE = 1500
CONFIGS = ("easy", "medium", "hard", "expert", "insane")
KINDS = ("single_turn", "tool_use", "multi_turn")

FAMILY_MODULE = """
    from functools import cache
    from pathlib import Path

    from hubgym.builders.families import load_index

    INDEX = Path(__file__).with_suffix(".json")
    BUILDER_CALLS = []  # names builder() was asked for: listing must never ask


    class _Family:
        name, prefix = "fake", "fk_"

        def entries(self):
            return load_index(INDEX, source=self.name)

        def builder(self, name):
            BUILDER_CALLS.append(name)
            return _builder(name)


    @cache
    def _builder(name):
        from hubgym.builders.base import TaskBuilder

        attributes = {"ENV": name, "VERIFIER": "v.py", "GOLDEN": "g.jsonl", "__module__": __name__}
        return type(name, (TaskBuilder,), attributes)


    FAMILY = _Family()
"""


def fake_entry(i: int) -> FamilyEnv:
    """Entry i: kinds cycle; every third is tagged math, the others games; even ones are also tagged even."""
    tags = ("math",) if i % 3 == 0 else ("games",)
    return FamilyEnv(name=f"fk_task_{i:04d}", kind=KINDS[i % 3], configs=CONFIGS if i % 2 == 0 else ("default",),
                     tags=tags + (("even",) if i % 2 == 0 else ()), source="fake", description=f"fake task number {i}")


def register_module(tmp_path, monkeypatch, family: str, prefix: str, source: str) -> str:
    """Write a family module under a unique name, put it on sys.path and register it; returns the module name."""
    module = f"hubgym_test_family_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.FAMILIES, family, f"{module}:FAMILY")
    monkeypatch.setitem(registry.FAMILY_PREFIXES, family, prefix)
    return module


@pytest.fixture
def fake_family(tmp_path, monkeypatch):
    """A registered 1500-env family 'fake' (prefix fk_) whose index is written by write_index."""
    module = register_module(tmp_path, monkeypatch, "fake", "fk_", FAMILY_MODULE)
    write_index(tmp_path / f"{module}.json", [fake_entry(i) for i in range(SIZE)])
    return module


@pytest.fixture
def broken_family(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, "broken", "hubgym_no_such_bridge:FAMILY")
    monkeypatch.setitem(registry.FAMILY_PREFIXES, "broken", "br_")


def hubgym(*args: str):
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "120"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def test_a_family_lists_from_its_index_and_filters_combine(fake_family):
    rows = catalog(source="fake")
    assert [r.name for r in rows] == [f"fk_task_{i:04d}" for i in range(SIZE)]
    assert rows[0].configs == list(CONFIGS) and rows[0].tags == ["math", "even"] and rows[0].kind == "single_turn"
    assert [r.name for r in catalog(source="fake", tags=["math", "even"], kind="single_turn")] == [
        f"fk_task_{i:04d}" for i in range(0, SIZE, 6)]
    assert [r.name for r in catalog(pattern="fk_task_00?7")] == [f"fk_task_00{d}7" for d in range(10)]
    assert [r.name for r in catalog(pattern="task_149")] == [f"fk_task_149{d}" for d in range(10)]
    assert catalog(source="fake", tags=["math", "games"]) == []
    assert sys.modules[fake_family].BUILDER_CALLS == []  # listing never asks a family for a builder


def test_builtins_come_first_then_families(fake_family):
    names = [r.name for r in catalog() if not r.error]
    assert names[:len(registry.BUILTIN_ENVS)] == list(registry.BUILTIN_ENVS)
    assert names.index("fk_task_0000") > names.index("reverse_text")
    assert catalog(source="builtin", tags=["games"], kind="multi_turn")[0].name == "wordle"


def test_env_names_hold_family_envs_without_building_any(fake_family):
    names = registry.env_names()
    assert "fk_task_1499" in names and "arithmetic" in names
    assert registry.env_names("fake") == [f"fk_task_{i:04d}" for i in range(SIZE)]
    assert registry.is_registered("fk_task_0042") and not registry.is_registered("fk_task_9999")
    assert sys.modules[fake_family].BUILDER_CALLS == []


def test_a_family_env_resolves_by_prefix_without_importing_other_families(fake_family, tmp_path, monkeypatch):
    other = register_module(tmp_path, monkeypatch, "other", "ot_", FAMILY_MODULE.replace('"fake", "fk_"',
                                                                                          '"other", "ot_"'))
    builder = resolve_env("fk_task_0042")
    assert builder.ENV == "fk_task_0042" and resolve_env("fk_task_0042") is builder
    assert sys.modules[fake_family].BUILDER_CALLS == ["fk_task_0042", "fk_task_0042"]
    assert other not in sys.modules


def test_an_unknown_name_in_a_family_prefix_names_the_closest_envs(fake_family):
    with pytest.raises(EnvNotFoundError) as err:
        resolve_env("fk_tsak_0042")
    message = str(err.value)
    assert message.startswith("no environment named 'fk_tsak_0042' in family 'fake'; did you mean fk_task_0042, ")
    assert message.endswith("list the family with `hubgym envs --source fake`")


def test_a_broken_family_is_one_row_and_nothing_else_notices(broken_family, fake_family):
    rows = [r for r in catalog() if r.source == "broken"]
    assert len(rows) == 1 and rows[0].name == "broken"
    assert "hubgym_no_such_bridge:FAMILY failed to load: ModuleNotFoundError" in rows[0].error
    assert "arithmetic" in registry.env_names() and registry.env_names("broken") == []
    assert resolve_env("fk_task_0001").ENV == "fk_task_0001"
    with pytest.raises(EnvNotFoundError, match="belongs to family 'broken' .* which failed to load: ModuleNotFound"):
        resolve_env("br_anything")
    result = hubgym("envs", "--source", "broken")
    assert result.exit_code == 0 and "broken: family hubgym_no_such_bridge:FAMILY failed to load" in result.output
    checked = hubgym("check", "--source", "broken")  # a broken family cannot pass a check run silently
    assert checked.exit_code == 1 and "FAIL broken / load" in checked.output
    assert "1 of 1 checks failed" in checked.output


@pytest.mark.slow
def test_the_table_is_one_line_per_env_with_long_config_lists_counted(fake_family):
    result = hubgym("envs", "--source", "fake")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip().startswith("fk_task_")]
    assert len(lines) == SIZE and f"hubgym environments: {SIZE} ({SIZE} fake)" in result.output
    assert lines[0].split()[:6] == ["fk_task_0000", "single_turn", "fake", "easy,", "medium,", "hard"]
    assert "hard +2" in lines[0] and max(len(line) for line in lines) <= 120
    narrow = CliRunner().invoke(app, ["envs", "--source", "fake"], env={"COLUMNS": "60"}).output.splitlines()
    assert len([line for line in narrow if line.startswith("  fk_task_")]) == SIZE
    assert max(len(line) for line in narrow) < 60


def test_json_output_parses_and_holds_family_and_failed_rows(fake_family, broken_family):
    result = hubgym("envs", "--format", "json")
    assert result.exit_code == 0
    rows = json.loads(result.output)
    by_source = {}
    for row in rows:
        by_source.setdefault(row["source"], []).append(row)
    assert len(by_source["fake"]) == SIZE and by_source["fake"][1]["tags"] == ["games"]
    assert [r["name"] for r in by_source["builtin"]] == list(registry.BUILTIN_ENVS)
    assert by_source["broken"][0]["error"].startswith("family hubgym_no_such_bridge:FAMILY failed to load")


def test_names_output_is_one_name_a_line_for_scripts(fake_family):
    result = hubgym("envs", "fk_task_001*", "--tag", "math", "--tag", "even", "--format", "names")
    assert result.stdout.split() == ["fk_task_0012", "fk_task_0018"]
    assert hubgym("envs", "--kind", "multi_turn", "--source", "builtin", "--format", "names").stdout.split() == [
        "wordle", "tictactoe"]


def test_an_unknown_source_is_refused_with_the_known_ones():
    result = hubgym("envs", "--source", "nope")
    assert result.exit_code == 1
    assert ("--source 'nope' is not a source of envs; give one of: builtin, reasoning_gym, textarena, openspiel, "
            "gymnasium, entry point") in " ".join(result.output.split())


def test_every_registered_family_has_a_prefix():
    assert set(registry.FAMILY_PREFIXES) == set(registry.FAMILIES)
    prefixes = list(registry.FAMILY_PREFIXES.values())
    assert len(set(prefixes)) == len(prefixes) and not any(n.startswith(tuple(prefixes)) for n in registry.BUILTIN_ENVS)


# -- hubgym check over many envs -------------------------------------------------------------------


def env_copy(parent: Path, name: str, first_line: str | None = None) -> Path:
    """The well-behaved baseline env under a new name; `first_line` runs first in generate_tasks."""
    folder = parent / name
    shutil.copytree(ENVS / "baseline", folder)
    source = (folder / "builder.py").read_text().replace('ENV = "baseline"', f'ENV = "{name}"')
    if first_line:
        source = source.replace("    def generate_tasks(self, split, size, seed):\n",
                                f"    def generate_tasks(self, split, size, seed):\n        {first_line}\n")
    (folder / "builder.py").write_text(source)
    return folder


def outcome(results) -> list[tuple[str, str, bool, str]]:
    return [(r.env, r.check, r.ok, r.message) for r in results]


def test_default_jobs_are_the_cpus_the_load_leaves_free(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert [default_jobs(load) for load in (0.0, 0.4, 1.6, 3.0, 4.0, 9.5)] == [4, 4, 2, 1, 1, 1]
    import psutil

    # By default what the last second kept busy on those CPUs (the load average lags minutes behind an ended run).
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval, percpu: [100.0, 90.0, 5.0, 0.0, 100.0, 100.0])
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    assert default_jobs() == 2


@pytest.mark.slow
def test_jobs_2_gives_the_results_of_jobs_1(tmp_path):
    names = [str(ENVS / "baseline"), str(ENVS / "golden_disagrees"), "tictactoe"]
    one = check_many(names, jobs=1, max_rows=2)
    two = check_many(names, jobs=2, max_rows=2)
    assert outcome(one) == outcome(two)
    assert [r.env for r in one][::len(CHECKS)] == ["baseline", "golden_disagrees", "tictactoe"]
    assert any(not r.ok for r in one if r.env == "golden_disagrees")
    assert all(r.ok for r in one if r.env != "golden_disagrees")


@pytest.mark.slow
def test_a_hang_and_a_crash_are_failure_rows_and_the_rest_goes_on(tmp_path):
    env_copy(tmp_path, "hangs", "import time; time.sleep(3600)")
    env_copy(tmp_path, "crashes", "import os; os._exit(3)")
    env_copy(tmp_path, "fine")
    result = hubgym("check", tmp_path, "--jobs", "3", "--timeout", "30", "--max-rows", "2")  # 30 s: "fine" must end
    assert result.exit_code == 1
    text = re.sub(r"\s+", " ", result.output)
    assert ("FAIL hangs / timeout timeout: checking stopped after 30 s: the env's checks did not finish (the last to "
            "finish was check_declaration; the next one hung) [env='hangs']. Fix: look for a loop that never "
            "ends") in text
    assert ("FAIL crashes / crash crash: the process checking this env exited with code 3 before its checks finished "
            "(the last to finish was check_declaration) [env='crashes']") in text
    assert re.search(r"fine\s+check_golden_replay\s+pass", result.output) and "FAIL fine" not in text
    assert f"error: 2 of {len(CHECKS) + 4} checks failed" in text  # fine's checks + 2 done and 2 failed


def test_the_shipped_builtin_index_matches_the_builders():
    from hubgym.envs.catalog import _builder_entry, _builder_module_sha256, _builtin_index

    index = _builtin_index()
    for name in registry.BUILTIN_ENVS:
        fresh = {"sha256": _builder_module_sha256(name), "entry": dataclasses.asdict(_builder_entry(name, "builtin"))}
        assert index.get(name) == fresh, f"{name} changed: run `python -m hubgym.envs.catalog` to regenerate the index"
    assert set(index) == set(registry.BUILTIN_ENVS)


def test_a_stale_builtin_index_row_is_read_from_the_class(monkeypatch):
    from hubgym.envs import catalog as module

    stale = {name: dict(row) for name, row in module._builtin_index().items()}
    stale["arithmetic"] = {"sha256": "0" * 64, "entry": {**stale["arithmetic"]["entry"], "description": "old"}}
    stale["wordle"] = {**stale["wordle"], "entry": {**stale["wordle"]["entry"], "description": "indexed"}}
    monkeypatch.setattr(module, "_builtin_index", lambda: stale)
    rows = {row.name: row for row in catalog(source="builtin")}
    assert rows["arithmetic"].description.startswith("Arithmetic: ") and rows["wordle"].description == "indexed"


@pytest.mark.slow
def test_many_envs_check_each_default_config_and_config_all_checks_every_one(tmp_path):
    folder = env_copy(tmp_path, "two_configs", "if self.config.name == 'broken': raise ValueError('no rows here')")
    source = (folder / "builder.py").read_text()
    declared = 'BUILDER_CONFIGS = [TaskConfig(name="default", sizes={"train": 12, "test": 4})]'
    (folder / "builder.py").write_text(source.replace(declared, declared.replace(
        "]", ', TaskConfig(name="broken", sizes={"train": 12, "test": 4})]')))
    env_copy(tmp_path, "fine")

    default = hubgym("check", tmp_path, "--jobs", "2", "--max-rows", "2")  # each env's default config
    assert default.exit_code == 0, default.output
    done = sorted(line.split(": ")[1] for line in default.output.splitlines() if line.startswith("checked "))
    assert done == [str(tmp_path / "fine"), str(tmp_path / "two_configs")]  # a line per env: no terminal, no bar
    every = hubgym("check", tmp_path, "--jobs", "2", "--max-rows", "2", "--config", "all")
    assert every.exit_code == 1
    assert "FAIL two_configs" in every.output and "config='broken'" in every.output and "FAIL fine" not in every.output
    one = hubgym("check", tmp_path, "--config", "broken")
    assert one.exit_code != 0 and "with several envs only --config all is known" in one.output
