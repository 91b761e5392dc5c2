"""Framing of `/polnet/artifact/1.0.0`.

Every message is a 4-byte big-endian length and a JSON object; a response
header with `"size": n` is followed by exactly n raw bytes. One stream carries
any number of request/response pairs in turn.

  request  {"op": "manifest", "id": ID}
           {"op": "read", "id": ID, "offset": O, "length": L}    (L <= 4 MiB)
  response {"ok": true, "size": n} + n bytes  (manifest JSON, or the range)
           {"ok": false, "error": "not_found" | "rate_limited" | "bad_request" | "too_large",
            "message": "..."}
"""

from __future__ import annotations

import json
import struct
from typing import Any, Protocol

from libp2p.custom_types import TProtocol

from node.boundary import decode_json_object
from node.errors import PeerMisbehaved

PROTOCOL_ID = TProtocol("/polnet/artifact/1.0.0")
MAX_HEADER = 64 * 1024
WRITE_SLICE = 1024 * 1024  # >= 256 KiB writes keep yamux at full speed


class Stream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...
    async def write(self, data: bytes) -> None: ...


class StreamClosed(EOFError):
    """The remote closed the stream between messages (a clean end)."""


async def read_exactly(stream: Stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            data = await stream.read(n - len(buf))
        except Exception as exc:  # StreamEOF/StreamReset/...: all mean "cut short"
            if not buf and type(exc).__name__ == "StreamEOF":
                raise StreamClosed() from exc
            raise
        if not data:
            if not buf:
                raise StreamClosed()
            raise EOFError(f"stream ended after {len(buf)} of {n} bytes")
        buf += data
    return bytes(buf)


async def read_frame(stream: Stream) -> dict[str, Any]:
    (length,) = struct.unpack(">I", await read_exactly(stream, 4))
    if length > MAX_HEADER:
        raise PeerMisbehaved(f"frame of {length} bytes exceeds {MAX_HEADER}")
    return decode_json_object(await read_exactly(stream, length), max_bytes=MAX_HEADER,
                              what="frame", error=PeerMisbehaved)


def encode_frame(obj: dict[str, Any]) -> bytes:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(raw)) + raw


async def write_payload(stream: Stream, header: dict[str, Any], body: bytes = b"") -> None:
    """Header and body; small bodies ride with the header, big ones go in big slices."""
    frame = encode_frame({**header, "size": len(body)})
    if len(body) <= WRITE_SLICE:
        await stream.write(frame + body)
        return
    await stream.write(frame)
    view = memoryview(body)
    for start in range(0, len(body), WRITE_SLICE):
        await stream.write(bytes(view[start:start + WRITE_SLICE]))
