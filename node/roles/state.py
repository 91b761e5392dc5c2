"""A role's own state on disk: a pydantic model, written atomically on every change.

It holds only what the chain cannot tell a restarted node: which jobs and
disputes concern it, its trace and published manifest, its vote salts. Phases
are not trusted from here: each pass derives them from the chain (see the
``*_machine`` modules). A file that does not parse (an older layout nobody
migrated, a truncated write by another tool) is set aside as ``*.bad`` and the
role starts afresh, ``fresh`` telling it to replay the chain's events from the
start so that whatever the chain says this node holds is picked up again.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from node.fsutil import atomic_write
from node.logs import get_logger

M = TypeVar("M", bound=BaseModel)
log = get_logger("polnet.state")


class RoleState(Generic[M]):
    """A model guarded by a lock (event handlers run in worker threads).

    ``migrate`` turns an older layout's JSON into the current one before validation.
    """

    def __init__(self, path: Path, model: type[M],
                 migrate: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.path = path
        self._lock = threading.RLock()
        self.data: M = model()
        self.fresh = True  # nothing usable on disk: the role recovers from the chain
        if path.is_file():
            try:
                raw = json.loads(path.read_text())
                if not isinstance(raw, dict):
                    raise ValueError(f"a JSON object was expected, got {type(raw).__name__}")
                self.data = model.model_validate(migrate(raw) if migrate else raw)
                self.fresh = False
            except (ValueError, ValidationError, OSError) as exc:
                bad = path.with_name(path.name + ".bad")
                with suppress(OSError):  # kept for a post-mortem, never read again
                    os.replace(path, bad)
                log.warning("state_unreadable", path=str(path), moved_to=str(bad),
                            error=str(exc)[:300])

    def __enter__(self) -> M:
        self._lock.acquire()
        return self.data

    def __exit__(self, *exc: object) -> None:
        try:
            self.save()
        finally:
            self._lock.release()

    def save(self) -> None:
        with self._lock:
            text = json.dumps(self.data.model_dump(mode="json"), indent=1, sort_keys=True)
            # Owner-only from creation: the verifier's state holds its vote salts.
            atomic_write(self.path, text.encode(), private=True)
