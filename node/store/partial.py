"""Resumable downloads: a `.part` file plus a log of verified chunks.

Each chunk is checked against the manifest before it is written. A chunk index
is appended to the log only after its bytes were fsynced, so after a crash the
log never claims bytes that are not on disk; a torn last log line is ignored,
and chunks that lie beyond a truncated `.part` file are fetched again. The
`.part` file is never longer than the verified chunks reach (a chunk written past
its end leaves a hole only up to that chunk).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path
from typing import Protocol

from node.errors import IntegrityError, StoreError
from node.fsutil import atomic_write
from node.logs import get_logger
from node.store.manifest import Manifest

log = get_logger(__name__)
# Batch fsyncs: durable progress every this many bytes, not every chunk.
SYNC_EVERY_BYTES = 32 * 1024 * 1024


class PartsOwner(Protocol):
    """What a download needs from its store (node.store.store.ArtifactStore); a
    protocol, so this module does not import the store that imports it."""

    parts_dir: Path

    def _adopt(self, tmp: Path, manifest: Manifest) -> None: ...

    def _download_closed(self, artifact_id: str) -> None: ...


class PartialDownload:
    """One artifact being assembled from verified chunks. Thread-safe."""

    def __init__(self, store: PartsOwner, manifest: Manifest) -> None:
        self.store = store
        self.manifest = manifest
        aid = manifest.artifact_id
        self.part_path = store.parts_dir / f"{aid}.part"
        self.log_path = store.parts_dir / f"{aid}.verified"
        self.manifest_path = store.parts_dir / f"{aid}.manifest.json"
        self._lock = threading.Lock()
        self._pending: list[int] = []
        self._pending_bytes = 0
        self.verified: set[int] = set()
        self._open()

    def _open(self) -> None:
        if self.manifest_path.exists():
            old = Manifest.from_bytes(self.manifest_path.read_bytes())
            if old.manifest_hash != self.manifest.manifest_hash:
                log.warning("part_manifest_changed", artifact=self.manifest.artifact_id)
                self._discard_files()
        if not self.manifest_path.exists():
            self._discard_files()
            atomic_write(self.manifest_path, self.manifest.to_bytes())
        self.verified = self._load_log()
        flags = os.O_RDWR | os.O_CREAT
        self._fd = os.open(self.part_path, flags, 0o644)
        length = os.fstat(self._fd).st_size
        # A truncated .part file loses the chunks that no longer fit in it.
        lost = {i for i in self.verified if sum(self.manifest.chunk_range(i)) > length}
        if lost:
            log.warning("part_truncated", artifact=self.manifest.artifact_id, lost=len(lost))
            self.verified -= lost
        # The file grows only as verified chunks are written: a manifest's claimed
        # size never becomes a file size (a lie of 60 GiB used to make a sparse file
        # of 60 GiB that every `ls` and quota saw). Only trailing junk is cut.
        if length > self.manifest.size:
            os.ftruncate(self._fd, self.manifest.size)
        self._log = open(self.log_path, "a", encoding="ascii")  # noqa: SIM115

    def _load_log(self) -> set[int]:
        if not self.log_path.exists():
            return set()
        good: set[int] = set()
        raw = self.log_path.read_text(encoding="ascii", errors="replace")
        lines = raw.split("\n")
        for line in lines[:-1] if not raw.endswith("\n") else lines:  # torn last line
            if line.isdigit() and int(line) < self.manifest.chunk_count:
                good.add(int(line))
        if not raw.endswith("\n") and raw:
            # Rewrite without the torn line so appends start on a fresh line.
            atomic_write(self.log_path, "".join(f"{i}\n" for i in sorted(good)).encode())
        return good

    def _discard_files(self) -> None:
        for p in (self.part_path, self.log_path, self.manifest_path):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    # --- progress ---------------------------------------------------------

    def missing(self) -> list[int]:
        with self._lock:
            return [i for i in range(self.manifest.chunk_count) if i not in self.verified]

    @property
    def verified_bytes(self) -> int:
        with self._lock:
            return sum(self.manifest.chunk_range(i)[1] for i in self.verified)

    def is_complete(self) -> bool:
        return not self.missing()

    # --- writing ----------------------------------------------------------

    def write_chunk(self, index: int, data: bytes) -> None:
        """Verify `data` as chunk `index` and write it. Blocking: call from a thread.

        Raises IntegrityError (and writes nothing) when the bytes do not match.
        """
        offset, length = self.manifest.chunk_range(index)
        if len(data) != length or hashlib.sha256(data).hexdigest() != self.manifest.chunks[index]:
            raise IntegrityError(
                f"chunk {index} of {self.manifest.artifact_id[:12]} fails its manifest hash")
        with self._lock:
            if index in self.verified:
                return
            os.pwrite(self._fd, data, offset)
            self.verified.add(index)
            self._pending.append(index)
            self._pending_bytes += length
            if self._pending_bytes >= SYNC_EVERY_BYTES:
                self._sync_locked()

    def _sync_locked(self) -> None:
        if not self._pending:
            return
        os.fsync(self._fd)  # data first, then the record that claims it
        self._log.write("".join(f"{i}\n" for i in self._pending))
        self._log.flush()
        os.fsync(self._log.fileno())
        self._pending.clear()
        self._pending_bytes = 0

    def sync(self) -> None:
        with self._lock:
            self._sync_locked()

    def close(self) -> None:
        with self._lock:
            if self._fd < 0:
                return
            self._sync_locked()
            os.close(self._fd)
            self._fd = -1
            self._log.close()
        self.store._download_closed(self.manifest.artifact_id)

    def finish(self) -> str:
        """Check the whole-file hash and move the artifact into the store.

        On a mismatch (a lying manifest) the part is discarded: IntegrityError.
        """
        if not self.is_complete():
            raise StoreError(f"{len(self.missing())} chunks still missing")
        self.close()
        digest = hashlib.sha256()
        with open(self.part_path, "rb") as fh:
            while block := fh.read(1024 * 1024):
                digest.update(block)
        if digest.hexdigest() != self.manifest.artifact_id:
            self._discard_files()
            raise IntegrityError(
                f"assembled file hashes to {digest.hexdigest()[:12]}, "
                f"not {self.manifest.artifact_id[:12]}: manifest was wrong; download discarded")
        self.store._adopt(self.part_path, self.manifest)
        self._discard_files()
        return self.manifest.artifact_id

    def __enter__(self) -> PartialDownload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
