"""Crash-safe file writes, one copy for the whole node: the store, traces, checkpoints,
datasets and role state all write through here."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path


def atomic_write(path: Path, data: bytes | Iterable[bytes | memoryview],
                 durable: bool = True, tmp_dir: Path | None = None,
                 private: bool = False) -> None:
    """tmp + rename, so a killed process leaves the old file or the new one, never
    half of one. ``data``: the bytes, or parts written in order (a file never held
    whole). ``durable`` adds fsyncs (file and directory) against power loss.
    ``tmp_dir``: where the temporary file lives (same filesystem as ``path``; default
    beside it, named ``.NAME.tmp-*`` so a clean-up can glob what a kill left).
    ``private``: owner-only (0600) from the file's creation, never readable by others
    even for an instant (keys, vote salts)."""
    where = tmp_dir if tmp_dir is not None else path.parent
    tmp = where / f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
        with os.fdopen(fd, "wb") as f:
            for part in (data,) if isinstance(data, bytes) else data:
                f.write(part)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def fsync_file(path: Path) -> None:
    """Make a file's bytes durable (one written by another process or library)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    try:
        dfd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems do not let a directory be opened
        return
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
