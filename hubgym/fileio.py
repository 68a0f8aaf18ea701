"""Atomic file writes (readers see the old file or the new one, never a half-written one) and file hashes."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path


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
