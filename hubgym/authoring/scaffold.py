"""`hubgym init NAME --kind KIND`: scaffold a new environment folder that passes `hubgym check` as generated.

    scaffold_env("my_env", Path("envs"), kind="multi_turn")
    # -> envs/my_env/{builder.py, verifier.py, golden.jsonl, README.md, test_env.py}

Each kind has its own example: single_turn adds two numbers, tool_use converts lengths with a tool of
its own (`tools.py`, shipped with the env), multi_turn is a higher/lower guessing game driven by the
verifier's reset/step. The files come
from `hubgym/authoring/templates/env/<kind>/*.tmpl` and the shared `.../templates/env/*.tmpl`
(`string.Template`, `${name}` placeholders). The folder is written next to its final place and
renamed into it, so a failure leaves nothing half-made.
"""

from __future__ import annotations

import keyword
import shutil
import sys
import tempfile
from pathlib import Path
from string import Template

from hubgym.builders.registry import BUILTIN_ENVS
from hubgym.envs.refs import check_env_name
from hubgym.errors import EnvContractError, Where

TEMPLATES = Path(__file__).parent / "templates" / "env"
KIND_TEXT: dict[str, dict[str, str]] = {  # what the shared README says about each kind's example
    "single_turn": {
        "summary": "add two whole numbers, answered in one turn",
        "verifier": "pure reward functions: `REWARDS = {fn: weight}` and `REWARD_RANGE`",
        "edit": "Change the reward functions in `verifier.py`: pure (no network, no file writes, no global\n"
                "   state), `def name(task, completion) -> float`; weight 0 makes a metric."},
    "tool_use": {
        "summary": "convert a length between units, calling the env's own `convert` tool (`tools.py`)",
        "verifier": "pure reward functions, `REWARD_RANGE` and `SUCCESS_THRESHOLD`; the rows' `tool_rewards` "
                    "add per-call shaping",
        "edit": "Change the tools in `tools.py` (typed `@hubgym.tool` functions, every parameter described\n"
                "   under `Args`), the tools the rows offer (`TOOLS` and `interaction(tools=...)`: the env's own\n"
                "   or hubgym's, e.g. `calculator`) and the rewards in `verifier.py` (pure,\n"
                "   `def name(task, completion) -> float`); `REWARD_RANGE` must bound the reward plus the shaping."},
    "multi_turn": {
        "summary": "find a secret number from higher/lower hints, one guess per turn",
        "verifier": "the MDP: `reset(task)` and `step(task, state, action)`, plus `REWARDS` and `REWARD_RANGE`",
        "edit": "Change `reset` and `step` in `verifier.py`: keep everything the episode needs in the JSON\n"
                "   `state` they return (no module-level state), and answer any reply, even an empty one.\n"
                "   Golden cases give `actions` (or a completion) and the task's `interaction`."},
}


def validate_env_name(name: str) -> None:
    """Refuse names that break the env-name rule (hubgym.envs.refs), or that would shadow something once the
    folder is a package: a keyword, a built-in env, a standard-library module."""
    where = Where(env=str(name)[:100], field="NAME")
    check_env_name(name, "NAME")
    if keyword.iskeyword(name):
        raise EnvContractError(f"env name {name!r} is a Python keyword", where,
                               "choose another name, e.g. 'count_vowels'")
    if name in BUILTIN_ENVS:
        raise EnvContractError(f"env name {name!r} is taken by a built-in environment", where,
                               "choose another name; built-ins: " + ", ".join(BUILTIN_ENVS))
    if name in sys.stdlib_module_names or name == "hubgym":
        raise EnvContractError(f"env name {name!r} would shadow the Python module {name!r} when installed", where,
                               f"choose another name, e.g. '{name}_env'")


def class_name(name: str) -> str:
    """'count_vowels' -> 'CountVowels' (the builder class)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def render(name: str, kind: str = "single_turn") -> dict[str, str]:
    """File name -> content of a new env folder of one interaction kind."""
    if kind not in KIND_TEXT:
        raise EnvContractError(f"unknown kind {kind!r}", Where(env=name, field="--kind"),
                               f"use one of: {', '.join(KIND_TEXT)}")
    values = {"name": name, "cls": class_name(name), "kind": kind, **KIND_TEXT[kind]}
    paths = [*TEMPLATES.glob("*.tmpl"), *(TEMPLATES / kind).glob("*.tmpl")]
    return {path.name.removesuffix(".tmpl"): Template(path.read_text()).substitute(values)
            for path in sorted(paths, key=lambda p: p.name)}


def scaffold_env(name: str, parent: str | Path = ".", kind: str = "single_turn") -> Path:
    """Create `parent/name/` with a working env of `kind`; refuse a bad name or kind, or an existing path."""
    validate_env_name(name)
    parent = Path(parent)
    target = parent / name
    if target.exists() or target.is_symlink():
        raise EnvContractError(f"{target} already exists; hubgym init never overwrites files",
                               Where(env=name, field="NAME"),
                               "pick another NAME or --dir, or move the existing folder away")
    files = render(name, kind)
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=parent))
    try:
        for file_name, text in files.items():
            (staging / file_name).write_text(text)
        staging.rename(target)  # atomic on one filesystem; fails if `target` appeared meanwhile
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
