"""node.fsutil: a write is all or nothing, and a private file is never readable by others."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.fsutil import atomic_write


def test_a_private_write_is_owner_only_from_creation(tmp_path: Path) -> None:
    old = os.umask(0)  # the widest umask: only the mode asked for protects the file
    try:
        atomic_write(tmp_path / "salts.json", b"{}", private=True)
        atomic_write(tmp_path / "node.json", b"{}", durable=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "salts.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "node.json").stat().st_mode) == 0o666


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    atomic_write(path, b"old")

    def parts() -> Iterator[bytes]:
        yield b"half of the new"
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, parts(), private=True)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
