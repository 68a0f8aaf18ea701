"""`hubgym init NAME`: scaffold a new environment folder that passes `hubgym check` as generated.

    scaffold_env("my_env", Path("envs"))
    # -> envs/my_env/{builder.py, verifier.py, golden.jsonl, README.md, test_env.py}

The files come from `hubgym/templates/env/*.tmpl` (`string.Template`, `${name}` placeholders). The
folder is written next to its final place and renamed into it, so a failure leaves nothing half-made.
"""

from __future__ import annotations

import keyword
import re
import shutil
import sys
import tempfile
from pathlib import Path
from string import Template

from hubgym.builders.registry import BUILTIN_ENVS
from hubgym.errors import EnvContractError, Where

TEMPLATES = Path(__file__).parent / "templates" / "env"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
NAME_RULE = "lowercase letters, digits and '_', starting with a letter, at most 48 characters"


def validate_env_name(name: str) -> None:
    """Refuse names that cannot be a module, an env id or an entry-point name, or that shadow something."""
    where, fix = Where(env=name, field="NAME"), f"use {NAME_RULE} (a Python identifier), e.g. 'count_vowels'"
    if not _NAME.match(name):
        raise EnvContractError(f"env name {name!r} is not a lowercase identifier", where, fix)
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


def render(name: str) -> dict[str, str]:
    """File name -> content of a new env folder."""
    values = {"name": name, "cls": class_name(name)}
    return {path.name.removesuffix(".tmpl"): Template(path.read_text()).substitute(values)
            for path in sorted(TEMPLATES.glob("*.tmpl"))}


def scaffold_env(name: str, parent: str | Path = ".") -> Path:
    """Create `parent/name/` with a working single_turn env; refuse a bad name or an existing path."""
    validate_env_name(name)
    parent = Path(parent)
    target = parent / name
    if target.exists() or target.is_symlink():
        raise EnvContractError(f"{target} already exists; hubgym init never overwrites files",
                               Where(env=name, field="NAME"),
                               "pick another NAME or --dir, or move the existing folder away")
    files = render(name)
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
