"""One process per node identity: a node's directory holds its p2p key, so two
processes under one ``--name`` would be one peer id on two ports (peers then see
equivocating signed records and flood their logs). An ``fcntl`` lock on
``HOME/nodes/NAME/p2p/lock`` is held for the node's life; the kernel drops it when
the process dies, so a killed node never leaves a stale lock behind."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from node.errors import ConfigError

LOCK_FILE = "lock"


@contextmanager
def hold_identity(home: Path) -> Iterator[None]:
    """Hold ``home``'s identity for the ``with`` block, or raise ConfigError naming
    the process that holds it."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            name = home.parent.name if home.name == "p2p" else home.name
            raise ConfigError(
                f"node {name!r} is already running{holder} with this identity ({home}): "
                f"stop it, or pass another --name to run a second node") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _read_holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        return ""
    return f" as process {pid}" if pid.isdigit() else ""
