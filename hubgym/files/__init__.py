"""Atomic file writes (readers see the old file or the new one, never a half-written one), file hashes, modules
run from the very bytes that were read (and hashed) once, and config files read only when they are small regular
files of text."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
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


MAX_CONFIG_BYTES = 16 << 20
"""16 MiB: a config or spec file (a training config, a mixture spec) lists settings and entries; a bigger file is
not one, and reading it whole is what a mistaken path (a dataset, /dev/zero) would do forever."""


def read_config_text(path: str | Path, limit: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; else ValueError saying why in a few words (no
    such file; not a regular file: a FIFO would block and a device never end; too large; not UTF-8, with the byte).
    """
    data = read_small_file(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at {exc.start})") from None


def read_small_file(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; else ValueError saying why (no such file, not a regular
    file, too large). The file is opened without blocking and checked on the open descriptor, so what is read is
    what was checked: a FIFO put where a file should be never blocks the reader, nor /dev/zero fills memory."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting for a writer
    except FileNotFoundError:
        raise ValueError("no such file") from None
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a folder opens too
            raise ValueError("not a regular file (a FIFO would block and a device never end)")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)  # at most one byte past the bound, whatever the file grew to since
    if len(data) > limit:
        raise ValueError(f"{max(info.st_size, len(data)):,} bytes, past the {limit:,} such a file may hold")
    return data


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
