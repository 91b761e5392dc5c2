"""`/polnet/artifact/1.0.0`: serving chunks, and fetching from several providers.

The fetcher keeps one bounded queue of received chunks between the network
readers and a single writer; hashing and disk writes run in a worker thread, so
readers never stall (yamux resets a stream whose reader stalls ~5 s). A chunk
that fails its manifest hash gets its sender dropped (PeerMisbehaved) and is
fetched again from another provider; verified chunks survive any failure in the
`.part` file, so a later fetch resumes where this one stopped.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID

from node.errors import (
    ArtifactNotFound,
    IntegrityError,
    P2PError,
    PeerMisbehaved,
    PeerUnavailable,
    RateLimited,
)
from node.logs import get_logger
from node.p2p.limits import PeerAllowance, ServeLimits
from node.p2p.wire import (
    PROTOCOL_ID,
    StreamClosed,
    encode_frame,
    read_exactly,
    read_frame,
    write_payload,
)
from node.store import ArtifactStore, Manifest
from node.store.manifest import MAX_CHUNK, MAX_MANIFEST_BYTES, is_artifact_id
from node.store.partial import PartialDownload

log = get_logger(__name__)
REQUEST_TIMEOUT_S = 30.0


# --- serving ---------------------------------------------------------------------


class ArtifactServer:
    def __init__(self, store: ArtifactStore, limits: ServeLimits | None = None) -> None:
        self.store = store
        self.limits = limits or ServeLimits()
        self.allowance = PeerAllowance(self.limits)
        self.served_bytes = 0

    async def handle(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        if not self.allowance.acquire(peer):
            await self._refuse(stream, "rate_limited", "too many concurrent streams")
            return
        try:
            while True:
                with trio.move_on_after(self.limits.idle_timeout_s) as idle:
                    try:
                        req = await read_frame(stream)
                    except StreamClosed:
                        break
                if idle.cancelled_caught:
                    break
                await self._answer(stream, peer, req)
            await stream.close()
        except (PeerMisbehaved, EOFError, P2PError) as exc:
            log.info("serve_stream_dropped", peer=peer, error=str(exc))
            await _reset(stream)
        except Exception as exc:  # a broken stream must never take the node down
            log.info("serve_stream_error", peer=peer, error=repr(exc))
            await _reset(stream)
        finally:
            self.allowance.release(peer)

    async def _answer(self, stream: INetStream, peer: str, req: dict[str, Any]) -> None:
        op, aid = req.get("op"), req.get("id")
        if not isinstance(aid, str) or not is_artifact_id(aid):
            await write_payload(stream, {"ok": False, "error": "bad_request",
                                         "message": "id must be 64 lowercase hex chars"})
            return
        if not self.store.has(aid):
            await write_payload(stream, {"ok": False, "error": "not_found", "message": aid})
            return
        if op == "manifest":
            raw = await trio.to_thread.run_sync(lambda: self.store.manifest(aid).to_bytes())
            await write_payload(stream, {"ok": True}, raw)
            return
        offset, length = req.get("offset"), req.get("length")
        size = self.store.size(aid)
        if (op != "read" or type(offset) is not int or type(length) is not int
                or offset < 0 or length <= 0 or offset + length > size):
            await write_payload(stream, {"ok": False, "error": "bad_request",
                                         "message": "need op=read, 0 <= offset < offset+length "
                                                    "<= size"})
            return
        if length > MAX_CHUNK:
            await write_payload(stream, {"ok": False, "error": "too_large",
                                         "message": f"length > {MAX_CHUNK}"})
            return
        await self.allowance.bucket(peer).take(length)
        data = await trio.to_thread.run_sync(self.store.read_range, aid, offset, length)
        await write_payload(stream, {"ok": True}, data)
        self.served_bytes += len(data)

    @staticmethod
    async def _refuse(stream: INetStream, error: str, message: str) -> None:
        try:
            await write_payload(stream, {"ok": False, "error": error, "message": message})
            await stream.close()
        except Exception:
            await _reset(stream)


async def _reset(stream: INetStream) -> None:
    with contextlib.suppress(Exception):  # already gone
        await stream.reset()


# --- client ----------------------------------------------------------------------


class ArtifactClient:
    """Request/response over one stream to one provider."""

    def __init__(self, stream: INetStream, peer: ID) -> None:
        self.stream = stream
        self.peer = peer

    @classmethod
    async def open(cls, host: IHost, peer: ID) -> ArtifactClient:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            stream = await host.new_stream(peer, [PROTOCOL_ID])
        return cls(stream, peer)

    async def _request(self, req: dict[str, Any], max_size: int) -> bytes:
        await self.send(req)
        return await self.receive(req, max_size)

    async def send(self, req: dict[str, Any]) -> None:
        await self.stream.write(encode_frame(req))

    async def receive(self, req: dict[str, Any], max_size: int) -> bytes:
        """The answer to `req` (answers come in request order)."""
        with trio.fail_after(REQUEST_TIMEOUT_S):
            head = await read_frame(self.stream)
        if head.get("ok") is not True:
            err, msg = head.get("error"), head.get("message", "")
            if err == "not_found":
                raise ArtifactNotFound(f"{self.peer} does not have {req.get('id')}")
            if err == "rate_limited":
                raise RateLimited(f"{self.peer} refused: {msg}")
            raise P2PError(f"{self.peer} answered {err}: {msg}")
        size = head.get("size")
        if type(size) is not int or not 0 <= size <= max_size:
            raise PeerMisbehaved(f"{self.peer} announced a body of {size!r} bytes")
        # No fail_after around the body: a slow but live sender keeps going,
        # a dead one ends in a stream error from the muxer.
        return await read_exactly(self.stream, size)

    async def manifest(self, artifact_id: str) -> Manifest:
        raw = await self._request({"op": "manifest", "id": artifact_id}, MAX_MANIFEST_BYTES)
        try:
            m = Manifest.from_bytes(raw)
        except ValueError as exc:
            raise PeerMisbehaved(f"{self.peer} sent an invalid manifest: {exc}") from None
        if m.artifact_id != artifact_id:
            raise PeerMisbehaved(f"{self.peer} sent the manifest of another artifact")
        return m

    @staticmethod
    def read_request(artifact_id: str, offset: int, length: int) -> dict[str, Any]:
        return {"op": "read", "id": artifact_id, "offset": offset, "length": length}

    async def read(self, artifact_id: str, offset: int, length: int) -> bytes:
        req = self.read_request(artifact_id, offset, length)
        await self.send(req)
        return await self.receive_range(req)

    async def receive_range(self, req: dict[str, Any]) -> bytes:
        length = req["length"]
        data = await self.receive(req, length)
        if len(data) != length:
            raise PeerMisbehaved(f"{self.peer} sent {len(data)} of {length} bytes")
        return data

    async def close(self) -> None:
        try:
            await self.stream.close()
        except Exception:
            await _reset(self.stream)


# --- multi-provider download ---------------------------------------------------------


Progress = Callable[[int, int], None]  # (verified bytes, total bytes)


@dataclass
class FetchStats:
    chunks_fetched: Counter[str] = field(default_factory=Counter)  # peer -> chunks
    bad_peers: set[str] = field(default_factory=set)
    failed_peers: dict[str, str] = field(default_factory=dict)
    resumed_chunks: int = 0


@dataclass
class _Work:
    missing: list[int]
    in_flight: set[int] = field(default_factory=set)
    changed: trio.Event = field(default_factory=trio.Event)

    def take(self) -> int | None:
        for i in self.missing:
            if i not in self.in_flight:
                self.in_flight.add(i)
                return i
        return None

    def give_back(self, i: int) -> None:
        self.in_flight.discard(i)
        self._poke()

    def done(self, i: int) -> None:
        self.in_flight.discard(i)
        self.missing.remove(i)
        self._poke()

    def _poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class Downloader:
    def __init__(self, host: IHost, store: ArtifactStore, streams_per_peer: int = 1,
                 queue_chunks: int = 8, pipeline: int = 3,
                 on_bad_peer: Callable[[ID, str], Awaitable[None]] | None = None) -> None:
        self.host = host
        self.store = store
        self.streams_per_peer = streams_per_peer
        self.queue_chunks = queue_chunks
        self.pipeline = pipeline
        self.on_bad_peer = on_bad_peer

    async def pick_manifest(self, artifact_id: str, peers: Sequence[ID],
                            stats: FetchStats) -> tuple[Manifest, list[ID]]:
        """Ask every provider for the manifest; use the one most of them agree on.

        Chunk size is a function of file size, so honest providers agree; a lying
        manifest is caught at the end by the whole-file hash anyway.
        """
        found: dict[ID, Manifest] = {}

        async def ask(peer: ID) -> None:
            try:
                client = await ArtifactClient.open(self.host, peer)
                try:
                    found[peer] = await client.manifest(artifact_id)
                finally:
                    await client.close()
            except PeerMisbehaved as exc:
                await self._bad(peer, str(exc), stats)
            except Exception as exc:
                stats.failed_peers[peer.to_base58()] = repr(exc)
                log.info("manifest_failed", peer=peer.to_base58(), error=repr(exc))

        async with trio.open_nursery() as nursery:
            for p in peers:
                nursery.start_soon(ask, p)
        if not found:
            raise PeerUnavailable(
                f"no provider served the manifest of {artifact_id}: {stats.failed_peers}")
        votes = Counter(m.manifest_hash for m in found.values())
        prev = self.store.part_manifest(artifact_id)
        if prev is not None and votes.get(prev.manifest_hash):
            best = prev.manifest_hash  # keep the chunks we already verified
        else:
            best = votes.most_common(1)[0][0]
        manifest = next(m for m in found.values() if m.manifest_hash == best)
        return manifest, [p for p, m in found.items() if m.manifest_hash == best]

    async def fetch(self, artifact_id: str, peers: Sequence[ID],
                    progress: Progress | None = None) -> FetchStats:
        """Download `artifact_id` from `peers` into the store. Idempotent and resumable."""
        stats = FetchStats()
        if self.store.has(artifact_id):
            return stats
        if not peers:
            raise PeerUnavailable(f"no providers known for {artifact_id}")
        manifest, peers = await self.pick_manifest(artifact_id, peers, stats)
        part = await trio.to_thread.run_sync(self.store.begin_download, manifest)
        try:
            missing = await trio.to_thread.run_sync(part.missing)
            stats.resumed_chunks = manifest.chunk_count - len(missing)
            work = _Work(missing)
            if missing:
                await self._run(manifest, part, work, peers, stats, progress)
            if work.missing:
                raise PeerUnavailable(
                    f"{len(work.missing)} of {manifest.chunk_count} chunks of {artifact_id} "
                    f"could not be fetched ({stats.failed_peers or 'no provider left'}); "
                    "verified chunks are kept: fetch again to resume")
            await trio.to_thread.run_sync(part.finish)
        finally:
            await trio.to_thread.run_sync(part.close)
        log.info("artifact_fetched", artifact=artifact_id, size=manifest.size,
                 per_peer=dict(stats.chunks_fetched), resumed_chunks=stats.resumed_chunks)
        return stats

    async def _run(self, manifest: Manifest, part: PartialDownload, work: _Work,
                   peers: Sequence[ID], stats: FetchStats, progress: Progress | None) -> None:
        send, recv = trio.open_memory_channel[tuple[int, bytes, ID]](self.queue_chunks)
        verified = manifest.size - sum(manifest.chunk_range(i)[1] for i in work.missing)
        banned: set[ID] = set()
        if progress:
            progress(verified, manifest.size)

        async def writer() -> None:
            nonlocal verified
            async for index, data, peer in recv:
                try:
                    await trio.to_thread.run_sync(part.write_chunk, index, data)
                except IntegrityError as exc:
                    work.give_back(index)
                    if peer not in banned:
                        banned.add(peer)
                        await self._bad(peer, str(exc), stats)
                    continue
                work.done(index)
                stats.chunks_fetched[peer.to_base58()] += 1
                verified += len(data)
                if progress:
                    progress(verified, manifest.size)

        async def reader(peer: ID) -> None:
            # Requests are pipelined: the next ones are on the wire while a chunk
            # arrives, so the stream never idles for a round trip.
            client: ArtifactClient | None = None
            pending: deque[tuple[int, dict[str, Any]]] = deque()
            try:
                client = await ArtifactClient.open(self.host, peer)
                while peer not in banned:
                    while len(pending) < self.pipeline and (index := work.take()) is not None:
                        req = client.read_request(manifest.artifact_id,
                                                  *manifest.chunk_range(index))
                        pending.append((index, req))
                        await client.send(req)
                    if not pending:
                        if not work.missing:
                            break
                        await work.changed.wait()
                        continue
                    data = await client.receive_range(pending[0][1])
                    index = pending.popleft()[0]
                    await send.send((index, data, peer))
            except PeerMisbehaved as exc:
                banned.add(peer)
                await self._bad(peer, str(exc), stats)
            except (trio.Cancelled, KeyboardInterrupt):
                raise
            except BaseException as exc:  # stream reset, peer died, refused, ...
                stats.failed_peers[peer.to_base58()] = repr(exc)
                log.info("provider_failed", peer=peer.to_base58(), error=repr(exc))
            finally:
                for index, _ in pending:
                    work.give_back(index)
                if client is not None:
                    with trio.CancelScope(shield=True), trio.move_on_after(2):
                        await client.close()

        async with trio.open_nursery() as outer:
            outer.start_soon(writer)
            async with send, trio.open_nursery() as readers:
                n = max(1, self.streams_per_peer)
                for peer in peers:
                    for _ in range(n):
                        readers.start_soon(reader, peer)
        await trio.to_thread.run_sync(part.sync)

    async def _bad(self, peer: ID, why: str, stats: FetchStats) -> None:
        stats.bad_peers.add(peer.to_base58())
        log.warning("peer_misbehaved", peer=peer.to_base58(), reason=why)
        if self.on_bad_peer is not None:
            await self.on_bad_peer(peer, why)
