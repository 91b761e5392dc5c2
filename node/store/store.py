"""Content-addressed artifact store on local disk.

Layout under `root`:
  objects/<id[:2]>/<id>      artifact bytes, id = sha256 hex of the file
  manifests/<id>.json        chunk manifest (canonical JSON)
  parts/<id>.part|.verified|.manifest.json   resumable downloads
  pins.json                  {id: [reason, ...]}: what GC must keep
  tmp/                       staging for atomic writes (same filesystem)
Files are streamed in blocks, never loaded whole.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import BinaryIO

from node.errors import ArtifactNotFound, ArtifactTooLarge, StoreError
from node.fsutil import atomic_write, fsync_dir
from node.logs import get_logger
from node.store.manifest import Manifest, ManifestBuilder, chunk_size_for, is_artifact_id
from node.store.partial import PartialDownload

log = get_logger(__name__)
BLOCK = 1024 * 1024
DEFAULT_MAX_SIZE = 64 * 1024**3


class ArtifactStore:
    def __init__(self, root: str | os.PathLike[str], max_size: int = DEFAULT_MAX_SIZE) -> None:
        self.root = Path(root)
        self.max_size = max_size
        self.objects_dir = self.root / "objects"
        self.manifests_dir = self.root / "manifests"
        self.parts_dir = self.root / "parts"
        self.tmp_dir = self.root / "tmp"
        for d in (self.objects_dir, self.manifests_dir, self.parts_dir, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._pins_path = self.root / "pins.json"
        self._lock = threading.Lock()
        self._active: Counter[str] = Counter()  # artifact id -> open PartialDownloads

    # --- lookup -------------------------------------------------------------

    @staticmethod
    def _check_id(artifact_id: str) -> str:
        if not is_artifact_id(artifact_id):
            raise StoreError(f"not an artifact id (64 lowercase hex chars): {artifact_id!r}")
        return artifact_id

    def path(self, artifact_id: str) -> Path:
        """Where the artifact's bytes live (whether or not it is present)."""
        aid = self._check_id(artifact_id)
        return self.objects_dir / aid[:2] / aid

    def has(self, artifact_id: str) -> bool:
        return is_artifact_id(artifact_id) and self.path(artifact_id).is_file()

    def open(self, artifact_id: str) -> BinaryIO:
        try:
            return open(self.path(artifact_id), "rb")  # noqa: SIM115
        except FileNotFoundError:
            raise ArtifactNotFound(f"artifact {artifact_id} is not in {self.root}") from None

    def size(self, artifact_id: str) -> int:
        try:
            return self.path(artifact_id).stat().st_size
        except FileNotFoundError:
            raise ArtifactNotFound(f"artifact {artifact_id} is not in {self.root}") from None

    def manifest(self, artifact_id: str) -> Manifest:
        mpath = self.manifests_dir / f"{self._check_id(artifact_id)}.json"
        if mpath.is_file():
            return Manifest.from_bytes(mpath.read_bytes())
        if not self.has(artifact_id):
            raise ArtifactNotFound(f"artifact {artifact_id} is not in {self.root}")
        # Object without manifest (e.g. crash between the two renames): rebuild it.
        with self.open(artifact_id) as fh:
            manifest = self._hash_stream(fh, self.size(artifact_id))
        atomic_write(mpath, manifest.to_bytes(), tmp_dir=self.tmp_dir)
        return manifest

    def read_range(self, artifact_id: str, offset: int, length: int) -> bytes:
        """Bytes [offset, offset+length) of an artifact (for serving chunks)."""
        with self.open(artifact_id) as fh:
            fh.seek(offset)
            return fh.read(length)

    def ids(self) -> list[str]:
        return sorted(p.name for p in self.objects_dir.glob("*/*") if is_artifact_id(p.name))

    # --- writing ------------------------------------------------------------

    def _hash_stream(self, src: BinaryIO, size: int, sink: BinaryIO | None = None) -> Manifest:
        builder = ManifestBuilder(chunk_size_for(size))
        while block := src.read(BLOCK):
            builder.update(block)
            if builder.size > self.max_size:
                raise ArtifactTooLarge(
                    f"artifact exceeds the store limit of {self.max_size} bytes")
            if sink is not None:
                sink.write(block)
        if builder.size != size:
            raise StoreError(f"source changed while reading: {builder.size} != {size} bytes")
        return builder.finish()

    def put_file(self, src: str | os.PathLike[str]) -> str:
        """Copy a file into the store (streaming) and return its artifact id."""
        size = os.stat(src).st_size
        if size > self.max_size:
            raise ArtifactTooLarge(
                f"{src}: {size} bytes exceeds the store limit of {self.max_size} bytes")
        with open(src, "rb") as fh:
            return self._put_stream(fh, size)

    def put_bytes(self, data: bytes) -> str:
        if len(data) > self.max_size:
            raise ArtifactTooLarge(
                f"{len(data)} bytes exceeds the store limit of {self.max_size} bytes")
        return self._put_stream(io.BytesIO(data), len(data))

    def _put_stream(self, src: BinaryIO, size: int) -> str:
        fd, tmp = tempfile.mkstemp(dir=self.tmp_dir, prefix="put-")
        try:
            with os.fdopen(fd, "wb") as out:
                manifest = self._hash_stream(src, size, out)
                out.flush()
                os.fsync(out.fileno())
            self._adopt(Path(tmp), manifest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        log.info("artifact_stored", artifact=manifest.artifact_id, size=manifest.size)
        return manifest.artifact_id

    def _adopt(self, tmp: Path, manifest: Manifest) -> None:
        """Move a verified, fsynced file into place: manifest first, then the object."""
        aid = manifest.artifact_id
        atomic_write(self.manifests_dir / f"{aid}.json", manifest.to_bytes(), tmp_dir=self.tmp_dir)
        dest = self.path(aid)
        dest.parent.mkdir(exist_ok=True)
        if dest.exists():
            tmp.unlink()
            return
        os.replace(tmp, dest)
        fsync_dir(dest.parent)

    def begin_download(self, manifest: Manifest) -> PartialDownload:
        """Start or resume assembling `manifest`'s artifact from verified chunks."""
        if manifest.size > self.max_size:
            raise ArtifactTooLarge(
                f"artifact {manifest.artifact_id[:12]} has {manifest.size} bytes, over the "
                f"store limit of {self.max_size}")
        part = PartialDownload(self, manifest)
        with self._lock:
            self._active[manifest.artifact_id] += 1
        return part

    def _download_closed(self, artifact_id: str) -> None:
        with self._lock:
            self._active[artifact_id] -= 1
            if self._active[artifact_id] <= 0:
                del self._active[artifact_id]

    def part_manifest(self, artifact_id: str) -> Manifest | None:
        """The manifest of an interrupted download of `artifact_id`, if one exists."""
        p = self.parts_dir / f"{self._check_id(artifact_id)}.manifest.json"
        return Manifest.from_bytes(p.read_bytes()) if p.is_file() else None

    # --- pins and GC ----------------------------------------------------------

    def _read_pins(self) -> dict[str, list[str]]:
        try:
            data = json.loads(self._pins_path.read_text())
        except FileNotFoundError:
            return {}
        return {str(k): [str(r) for r in v] for k, v in data.items()}

    def _write_pins(self, pins: dict[str, list[str]]) -> None:
        raw = json.dumps({k: sorted(v) for k, v in sorted(pins.items()) if v}, indent=1)
        atomic_write(self._pins_path, raw.encode(), tmp_dir=self.tmp_dir)

    def pin(self, artifact_id: str, reason: str) -> None:
        """Keep `artifact_id` through GC for `reason` (e.g. "job:42")."""
        self._check_id(artifact_id)
        with self._lock:
            pins = self._read_pins()
            reasons = pins.setdefault(artifact_id, [])
            if reason not in reasons:
                reasons.append(reason)
                self._write_pins(pins)

    def unpin(self, artifact_id: str, reason: str | None = None) -> None:
        """Drop one reason (or all with reason=None) for keeping `artifact_id`."""
        with self._lock:
            pins = self._read_pins()
            if artifact_id in pins:
                pins[artifact_id] = [] if reason is None else [
                    r for r in pins[artifact_id] if r != reason]
                self._write_pins(pins)

    def unpin_reason(self, reason: str) -> None:
        """Drop `reason` from every artifact (e.g. a job was finalized)."""
        with self._lock:
            pins = self._read_pins()
            self._write_pins({k: [r for r in v if r != reason] for k, v in pins.items()})

    def release(self, reason: str) -> list[str]:
        """Drop `reason` from every artifact and delete those it alone kept.

        Only artifacts that were pinned for `reason` are touched: what was never
        pinned (e.g. what this node publishes itself) stays. Returns deleted ids.
        """
        with self._lock:
            pins = self._read_pins()
            freed = [k for k, v in pins.items() if reason in v and set(v) == {reason}]
            self._write_pins({k: [r for r in v if r != reason] for k, v in pins.items()})
            for aid in freed:
                self._delete(aid)
        if freed:
            log.info("store_released", reason=reason, removed=len(freed))
        return freed

    def _delete(self, aid: str) -> None:
        self.path(aid).unlink(missing_ok=True)
        (self.manifests_dir / f"{aid}.json").unlink(missing_ok=True)
        if aid not in self._active:  # a pinned download nobody will finish now
            self._unlink_partial(aid)

    def _unlink_partial(self, aid: str) -> bool:
        files = [self.parts_dir / f"{aid}{s}" for s in (".part", ".verified", ".manifest.json")]
        found = any(f.exists() for f in files)
        for f in files:
            f.unlink(missing_ok=True)
        return found

    def discard_partial(self, artifact_id: str) -> bool:
        """Delete the interrupted download of `artifact_id` (a fetch that failed for
        good: nothing left to resume it from). An open download is left alone.
        Returns whether there was one."""
        aid = self._check_id(artifact_id)
        with self._lock:
            if aid in self._active:
                return False
            found = self._unlink_partial(aid)
        if found:
            log.info("store_partial_discarded", artifact=aid)
        return found

    def gc_partials(self, max_age_s: float) -> list[str]:
        """Delete interrupted downloads untouched for `max_age_s` (not open ones, not
        pinned ones). Returns their artifact ids."""
        now = time.time()
        removed: list[str] = []
        with self._lock:
            pinned = set(self._read_pins())
            for p in self.parts_dir.glob("*.manifest.json"):
                aid = p.name.split(".")[0]
                if aid in pinned or aid in self._active:
                    continue
                files = [self.parts_dir / f"{aid}{s}" for s in (".part", ".verified",
                                                               ".manifest.json")]
                touched = max((f.stat().st_mtime for f in files if f.exists()), default=0.0)
                if now - touched > max_age_s:
                    self._unlink_partial(aid)
                    removed.append(aid)
        if removed:
            log.info("store_gc_partials", removed=len(removed))
        return removed

    def pins(self) -> dict[str, list[str]]:
        with self._lock:
            return self._read_pins()

    def gc(self, part_max_age_s: float = 24 * 3600) -> list[str]:
        """Delete unpinned artifacts and stale unpinned partial downloads.

        Returns the ids of deleted artifacts.
        """
        with self._lock:
            pinned = set(self._read_pins())
            removed: list[str] = []
            for aid in self.ids():
                if aid not in pinned:
                    self._delete(aid)
                    removed.append(aid)
            now = time.time()
        self.gc_partials(part_max_age_s)
        with self._lock:
            for p in self.tmp_dir.iterdir():  # leftovers of crashed writes
                if now - p.stat().st_mtime > 3600:
                    p.unlink(missing_ok=True)
        if removed:
            log.info("store_gc", removed=len(removed))
        return removed
