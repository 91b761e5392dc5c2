"""Chunk manifests: how an artifact splits into independently verifiable chunks.

The artifact id is the sha256 of the whole file; the manifest lists the sha256
of every chunk so a receiver can verify (and keep) each chunk as it arrives,
long before the whole-file hash can be checked. Chunk size is a pure function
of the file size, so honest providers of one artifact serve identical manifests.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from node.boundary import decode_json_object
from node.errors import MalformedInput

MiB = 1024 * 1024
MIN_CHUNK = 1 * MiB
MAX_CHUNK = 4 * MiB
HEX64 = r"^[0-9a-f]{64}$"
Sha256Hex = Annotated[str, Field(pattern=HEX64)]
# A manifest for a 64 GiB artifact in 4 MiB chunks is ~1.1 MB of JSON; keep
# manifests below this so they stay cheap to fetch and hash.
MAX_MANIFEST_BYTES = 2 * MiB


def chunk_size_for(size: int) -> int:
    """1 MiB chunks up to 1 GiB, 4 MiB above (keeps manifests small)."""
    return MIN_CHUNK if size <= 1024 * MiB else MAX_CHUNK


def is_artifact_id(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


class Manifest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    version: Literal[1] = 1
    artifact_id: Sha256Hex
    size: int = Field(ge=0)
    chunk_size: int = Field(ge=MIN_CHUNK, le=MAX_CHUNK)
    chunks: list[Sha256Hex]

    @model_validator(mode="after")
    def _chunk_count(self) -> Manifest:
        expected = -(-self.size // self.chunk_size)
        if len(self.chunks) != expected:
            raise ValueError(f"{len(self.chunks)} chunk hashes for {expected} chunks")
        return self

    def to_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces): what `manifest_hash` hashes."""
        data = self.model_dump(mode="json")
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        """A manifest from a peer or disk; MalformedInput (a ValueError) if bad."""
        obj = decode_json_object(raw, max_bytes=MAX_MANIFEST_BYTES, what="chunk manifest")
        try:
            return cls.model_validate(obj, strict=True)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(map(str, err["loc"])) or "top level"
            raise MalformedInput(f"chunk manifest is invalid at {where}: {err['msg']}") from None

    @property
    def manifest_hash(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @property
    def chunk_count(self) -> int:
        return len(self.chunks)

    def chunk_range(self, index: int) -> tuple[int, int]:
        """(offset, length) of chunk `index`."""
        if not 0 <= index < len(self.chunks):
            raise IndexError(f"chunk {index} out of range 0..{len(self.chunks) - 1}")
        offset = index * self.chunk_size
        return offset, min(self.chunk_size, self.size - offset)


class ManifestBuilder:
    """Incremental hashing of a byte stream into (artifact id, chunk hashes)."""

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self._whole = hashlib.sha256()
        self._chunk = hashlib.sha256()
        self._in_chunk = 0
        self._chunks: list[str] = []
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        self._whole.update(data)
        self.size += len(data)
        view = memoryview(data)
        while view:
            take = min(len(view), self.chunk_size - self._in_chunk)
            self._chunk.update(view[:take])
            self._in_chunk += take
            view = view[take:]
            if self._in_chunk == self.chunk_size:
                self._chunks.append(self._chunk.hexdigest())
                self._chunk = hashlib.sha256()
                self._in_chunk = 0

    def finish(self) -> Manifest:
        chunks = list(self._chunks)
        if self._in_chunk:
            chunks.append(self._chunk.hexdigest())
        return Manifest(artifact_id=self._whole.hexdigest(), size=self.size,
                        chunk_size=self.chunk_size, chunks=chunks)
