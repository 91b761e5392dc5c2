"""Small filesystem helpers for crash-safe writes."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(dest: Path, data: bytes, tmp_dir: Path | None = None) -> None:
    """tmp + fsync + rename: readers see the old file or the new one, never half."""
    tmp_dir = tmp_dir or dest.parent
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(dest.parent)
