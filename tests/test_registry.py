"""The env registry: built-ins by (versioned) name, entry points, and folders; the builder base's row checks."""

import textwrap

import datasets
import pytest

from hubgym.envs import build_tasks, resolve_env
from hubgym.builders.arithmetic import Arithmetic
from hubgym.builders import registry
from hubgym.builders.registry import ENTRY_POINT_GROUP, env_names
from hubgym.errors import EnvContractError, EnvNotFoundError

BUILDER = """
    from hubgym import TaskBuilder, TaskConfig, make_task, user

    class Echo(TaskBuilder):
        ENV = "echo"
        VERIFIER = "verifier.py"
        GOLDEN = "golden.jsonl"
        BUILDER_CONFIGS = [TaskConfig(name="default", sizes={{"train": 3}})]

        def generate_tasks(self, split, size, seed):
            for i in {range_expr}:
                yield make_task(self.ENV, [user(f"say {{i}}")], {{"word": str(i)}})
"""


def _env_folder(tmp_path, range_expr="range(size)"):
    folder = tmp_path / "echo"
    folder.mkdir()
    (folder / "builder.py").write_text(textwrap.dedent(BUILDER.format(range_expr=range_expr)))
    (folder / "verifier.py").write_text("def same(task, completion):\n    return 1.0\nREWARDS = {same: 1.0}\n")
    (folder / "golden.jsonl").write_text("")
    return folder


def test_builtin_by_name_and_version():
    assert resolve_env("arithmetic") is Arithmetic
    assert resolve_env("arithmetic-v2") is Arithmetic
    with pytest.raises(EnvNotFoundError, match="is at version 2, not 7; use 'arithmetic-v2'"):
        resolve_env("arithmetic-v7")


def test_unknown_name_lists_known_envs():
    with pytest.raises(EnvNotFoundError, match=r"no environment named 'nope'; known: arithmetic, gsm8k"):
        resolve_env("nope")


def test_env_from_folder_builds(tmp_path):
    builder = resolve_env(str(_env_folder(tmp_path)))
    assert builder.ENV == "echo" and builder.verifier().score is not None
    rows = build_tasks(builder)["train"]
    assert [r["info"]["word"] for r in rows] == ["0", "1", "2"] and set(rows["split"]) == {"train"}


def test_env_from_entry_point(tmp_path, monkeypatch):
    folder = _env_folder(tmp_path)
    (folder / "__init__.py").write_text("")
    dist = tmp_path / "echo_env-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-env\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\necho = echo.builder:Echo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "echo" in env_names()
    assert resolve_env("echo").ENV == "echo"


def test_duplicate_task_is_refused_with_location(tmp_path):
    builder = resolve_env(str(_env_folder(tmp_path, range_expr="[1, 1]")))
    with pytest.raises(datasets.exceptions.DatasetGenerationError) as err:
        build_tasks(builder)
    cause = err.value.__cause__
    assert isinstance(cause, EnvContractError)
    assert "was generated twice" in str(cause) and "split='train'" in str(cause) and "field='id'" in str(cause)


def test_folder_without_builder_is_a_clear_error(tmp_path):
    with pytest.raises(EnvNotFoundError, match="no builder file at .*hubgym init NAME"):
        resolve_env(str(tmp_path))


def test_unknown_name_lists_each_family_as_its_prefix(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, "games", "hubgym_no_such_games_bridge:FAMILY")
    monkeypatch.setitem(registry.FAMILY_PREFIXES, "games", "gm_")
    with pytest.raises(EnvNotFoundError) as err:
        resolve_env("nope")
    assert ", reverse_text, " in str(err.value) and "gm_* (`hubgym envs --source games`)" in str(err.value)
    assert str(err.value).endswith("Give a built-in or family env name, an installed 'hubgym.envs' entry point, "
                                   "or a path to a folder with builder.py")


def test_an_entry_point_beside_the_families_is_listed_after_them(tmp_path, monkeypatch):
    test_env_from_entry_point(tmp_path, monkeypatch)
    assert env_names()[-1] == "echo" and env_names("entry point") == ["echo"]
    assert "echo" not in env_names("builtin")
