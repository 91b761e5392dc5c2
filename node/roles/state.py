"""A role's own state on disk: what it is working on, so a restart (even after
SIGKILL) picks up where it was. Written atomically on every change; small."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


class RoleState:
    """A JSON document guarded by a lock (event handlers run in worker threads)."""

    def __init__(self, path: Path, default: dict[str, Any]) -> None:
        self.path = path
        self._lock = threading.RLock()
        self.data: dict[str, Any] = default
        if path.is_file():
            self.data.update(json.loads(path.read_text()))

    def __enter__(self) -> dict[str, Any]:
        self._lock.acquire()
        return self.data

    def __exit__(self, *exc: object) -> None:
        try:
            self.save()
        finally:
            self._lock.release()

    def save(self) -> None:
        with self._lock:
            # A unique temporary name: a stale or concurrent writer can never collide.
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}."
                                      f"{threading.get_ident()}.tmp")
            # Owner-only from creation: the verifier's state holds its vote salts.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(self.data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
