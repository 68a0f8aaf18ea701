"""Atomic file writes (readers see the old file or the new one, never a half-written one), file hashes, and
modules run from the very bytes that were read (and hashed) once."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import uuid
from pathlib import Path
from types import ModuleType


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a hidden uniquely named temp file beside `path`, fsync it, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(staged, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staged, path)


def replace_dir(staged: Path, final: Path) -> None:
    """Move a fully written folder to `final`; an existing `final` is set aside first and removed after.

    Directories cannot be renamed over one another, so there is a moment with no `final`; never one
    with half of it. A crash at that moment leaves `.{name}.old` beside it.
    """
    import shutil

    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    staged.rename(final)
    fd = os.open(final.parent, os.O_RDONLY)  # make the renames durable
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    shutil.rmtree(old, ignore_errors=True)


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def import_source(path: Path, source: bytes) -> ModuleType:
    """Run `source` as the module of file `path`, under a name derived from the path and the bytes (stable,
    collision-free: the same file with other contents is another module)."""
    digest = hashlib.sha256(str(path).encode() + b"\0" + source).hexdigest()[:16]
    name = f"hubgym_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    code = compile(source, str(path), "exec")  # a SyntaxError here is the one importing the file would raise
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None, origin=str(path)))
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:  # a half-run module must not be found by the next attempt
        del sys.modules[name]
        raise
    return module
