"""Which envs a path names: an env folder (it holds builder.py), or a folder of env folders.

    env_folders("envs")   # -> [("envs/count_vowels", "count_vowels"), ("envs/games/guess", "games/guess")]

Light on purpose (pathlib only): the pytest plugin uses it while collecting.
"""

from __future__ import annotations

from pathlib import Path

BUILDER_FILE = "builder.py"


def env_folders(folder: str | Path) -> list[tuple[str, str]]:
    """(path, label) of every env folder at or below `folder`, sorted; a label is the path relative to `folder`
    (the folder's own name when it is an env folder itself).

    An env folder is not searched further (its own subfolders are its data); hidden folders and folders
    starting with '_' (__pycache__) are skipped. Empty when no folder holds builder.py.
    """
    root = Path(folder)
    if (root / BUILDER_FILE).is_file():
        return [(str(root), root.resolve().name)]
    return [(str(path), path.relative_to(root).as_posix()) for path in _below(root)]


def _below(folder: Path) -> list[Path]:
    found = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        found += [child] if (child / BUILDER_FILE).is_file() else _below(child)
    return found
