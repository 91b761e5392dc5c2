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
    PeerTooSlow,
    PeerUnavailable,
    RateLimited,
)
from node.logs import get_logger
from node.p2p.limits import DEFAULT_POLICY, FetchPolicy, PeerAllowance, ServeLimits
from node.p2p.loopwatch import run_within
from node.p2p.wire import (
    PROTOCOL_ID,
    StreamClosed,
    encode_frame,
    read_exactly,
    read_frame,
    write_payload,
)
from node.store import ArtifactStore, Manifest
from node.store.manifest import MAX_CHUNK, MAX_MANIFEST_BYTES, chunk_size_for, is_artifact_id
from node.store.partial import PartialDownload

log = get_logger(__name__)


# --- serving ---------------------------------------------------------------------


class ArtifactServer:
    def __init__(self, store: ArtifactStore, limits: ServeLimits | None = None) -> None:
        self.store = store
        self.limits = limits or ServeLimits()
        self.allowance = PeerAllowance(self.limits)
        self.served_bytes = 0

    def set_staked(self, peer_ids: set[str]) -> None:
        """Peer ids (base58) of nodes with slashable stake: they may use reserved slots."""
        self.allowance.staked = set(peer_ids)

    def set_seats(self, peer_ids: set[str]) -> None:
        """Peer ids of the committees and juries of live disputes: served first."""
        self.allowance.seats = set(peer_ids)

    async def handle(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        slot = self.allowance.claim(peer, _remote_ip(stream))
        if slot is None:
            await self._refuse(stream, "rate_limited", "too many concurrent streams")
            return
        cut = False
        try:
            with trio.CancelScope() as scope:
                slot.cancel = scope  # eviction cancels us while we wait for a request
                while not slot.released:
                    slot.idle_since = trio.current_time()
                    with trio.move_on_after(self.limits.idle_timeout_s) as idle:
                        try:
                            req = await read_frame(stream)
                        except StreamClosed:
                            break
                    if idle.cancelled_caught:
                        break
                    slot.idle_since = None  # busy: not evictable while answering
                    pulled = 0
                    with trio.move_on_after(self.limits.answer_timeout_s) as slow:
                        pulled = await self._answer(stream, peer, req)
                    if slow.cancelled_caught:  # a reader that will not take its answer
                        log.info("serve_answer_timeout", peer=peer)
                        cut = True
                        break
                    if not self.allowance.charge(slot, pulled):
                        # Asking without consuming: the slot goes to someone who will.
                        log.info("serve_stream_cut", peer=peer, reason="cheap requests",
                                 in_a_row=slot.cheap)
                        cut = True
                        break
            if cut or scope.cancelled_caught or slot.released:
                await _reset(stream)
                return
            await stream.close()
        except (PeerMisbehaved, EOFError, P2PError) as exc:
            log.info("serve_stream_dropped", peer=peer, error=str(exc))
            await _reset(stream)
        except Exception as exc:  # a broken stream must never take the node down
            log.info("serve_stream_error", peer=peer, error=repr(exc))
            await _reset(stream)
        finally:
            self.allowance.release(slot)

    async def _answer(self, stream: INetStream, peer: str, req: dict[str, Any]) -> int:
        """Answer one request; returns the chunk bytes it pulled (0: a cheap request)."""
        op, aid = req.get("op"), req.get("id")
        if not isinstance(aid, str) or not is_artifact_id(aid):
            await write_payload(stream, {"ok": False, "error": "bad_request",
                                         "message": "id must be 64 lowercase hex chars"})
            return 0
        if not self.store.has(aid):
            await write_payload(stream, {"ok": False, "error": "not_found", "message": aid})
            return 0
        if op == "manifest":
            raw = await trio.to_thread.run_sync(lambda: self.store.manifest(aid).to_bytes())
            await write_payload(stream, {"ok": True}, raw)
            return 0
        offset, length = req.get("offset"), req.get("length")
        size = self.store.size(aid)
        if (op != "read" or type(offset) is not int or type(length) is not int
                or offset < 0 or length <= 0 or offset + length > size):
            await write_payload(stream, {"ok": False, "error": "bad_request",
                                         "message": "need op=read, 0 <= offset < offset+length "
                                                    "<= size"})
            return 0
        if length > MAX_CHUNK:
            await write_payload(stream, {"ok": False, "error": "too_large",
                                         "message": f"length > {MAX_CHUNK}"})
            return 0
        await self.allowance.bucket(peer).take(length)
        data = await trio.to_thread.run_sync(self.store.read_range, aid, offset, length)
        await write_payload(stream, {"ok": True}, data)
        self.served_bytes += len(data)
        return len(data)

    @staticmethod
    async def _refuse(stream: INetStream, error: str, message: str) -> None:
        try:
            await write_payload(stream, {"ok": False, "error": error, "message": message})
            await stream.close()
        except Exception:
            await _reset(stream)


def _remote_ip(stream: INetStream) -> str | None:
    try:
        addr = stream.get_remote_address()
    except Exception:
        return None
    return str(addr[0]) if addr else None


def _only_cancelled(exc: BaseException) -> bool:
    """A group of nothing but Cancelled (libp2p's nurseries wrap ours): re-raise it."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancelled(e) for e in exc.exceptions)
    return isinstance(exc, trio.Cancelled)


async def _reset(stream: INetStream) -> None:
    with contextlib.suppress(Exception):  # already gone
        await stream.reset()


# --- client ----------------------------------------------------------------------




class ArtifactClient:
    """Request/response over one stream to one provider."""

    def __init__(self, stream: INetStream, peer: ID,
                 policy: FetchPolicy = DEFAULT_POLICY) -> None:
        self.stream = stream
        self.peer = peer
        self.policy = policy
        self.bytes_received = 0

    @classmethod
    async def open(cls, host: IHost, peer: ID,
                   policy: FetchPolicy = DEFAULT_POLICY) -> ArtifactClient:
        with trio.fail_after(policy.open_timeout_s):
            stream = await host.new_stream(peer, [PROTOCOL_ID])
        return cls(stream, peer, policy)

    async def _request(self, req: dict[str, Any], max_size: int) -> bytes:
        await self.send(req)
        return await self.receive(req, max_size)

    async def send(self, req: dict[str, Any]) -> None:
        with trio.fail_after(self.policy.header_timeout_s):
            await self.stream.write(encode_frame(req))

    async def receive(self, req: dict[str, Any], max_size: int) -> bytes:
        """The answer to `req` (answers come in request order), within its deadline."""
        got, late = await run_within(self.policy.header_timeout_s,
                                     lambda: read_frame(self.stream))
        if late or got is None:
            raise PeerTooSlow(f"{self.peer} too slow: no answer in "
                              f"{self.policy.header_timeout_s:.0f}s")
        head = got
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
        deadline = self.policy.body_deadline(size)
        body, late = await run_within(deadline, lambda: read_exactly(self.stream, size))
        if late or body is None:
            raise PeerTooSlow(
                f"{self.peer} too slow: {size} bytes not sent in {deadline:.1f}s "
                f"(minimum {self.policy.min_rate_bps / 1024:.0f} KiB/s)")
        return body

    async def manifest(self, artifact_id: str) -> Manifest:
        raw = await self._request({"op": "manifest", "id": artifact_id}, MAX_MANIFEST_BYTES)
        try:
            m = Manifest.from_bytes(raw)
        except ValueError as exc:
            raise PeerMisbehaved(f"{self.peer} sent an invalid manifest: {exc}") from None
        if m.artifact_id != artifact_id:
            raise PeerMisbehaved(f"{self.peer} sent the manifest of another artifact")
        if m.chunk_size != chunk_size_for(m.size):
            raise PeerMisbehaved(f"{self.peer} sent a manifest with chunks of {m.chunk_size} "
                                 f"bytes for a {m.size}-byte artifact")
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
        self.bytes_received += len(data)
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
    bytes_received: int = 0      # chunk bytes off the wire (duplicates and rejects included)
    reissued_chunks: int = 0     # chunks also asked of a second provider (endgame)
    manifests_tried: int = 0


@dataclass
class _Work:
    """Chunks still missing, and who is fetching which.

    A chunk is first given to one provider. Once nothing is left untaken, an idle
    provider also asks for a chunk another one holds ("endgame"): a slow provider
    then delays nobody, and the first verified copy wins.
    """

    missing: list[int]
    holders: dict[int, set[ID]] = field(default_factory=dict)
    changed: trio.Event = field(default_factory=trio.Event)
    max_holders: int = 2
    reissued: int = 0

    def take(self, peer: ID) -> int | None:
        for i in self.missing:
            if not self.holders.get(i):
                self.holders.setdefault(i, set()).add(peer)
                return i
        # Endgame: duplicate the chunk held by the fewest others.
        best: int | None = None
        for i in self.missing:
            held = self.holders.get(i, set())
            if peer not in held and len(held) < self.max_holders and (
                    best is None or len(held) < len(self.holders[best])):
                best = i
        if best is not None:
            self.holders[best].add(peer)
            self.reissued += 1
        return best

    def give_back(self, i: int, peer: ID) -> None:
        self.holders.get(i, set()).discard(peer)
        self._poke()

    def done(self, i: int) -> bool:
        """Record chunk `i` as verified; False if another copy already was."""
        self.holders.pop(i, None)
        if i not in self.missing:
            return False
        self.missing.remove(i)
        self._poke()
        return True

    def _poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class _ManifestRound:
    """Manifests the providers answered for one artifact, and their streams."""

    def __init__(self) -> None:
        self.by_peer: dict[ID, Manifest] = {}
        self.clients: dict[ID, ArtifactClient] = {}

    def sources(self, manifest_hash: str) -> list[ID]:
        return [p for p, m in self.by_peer.items() if m.manifest_hash == manifest_hash]

    async def close(self) -> None:
        for c in self.clients.values():
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await c.close()
        self.clients.clear()


class Downloader:
    MAX_MANIFEST_ROUNDS = 3

    def __init__(self, host: IHost, store: ArtifactStore, streams_per_peer: int = 1,
                 queue_chunks: int = 8, pipeline: int = 3,
                 on_bad_peer: Callable[[ID, str, bool], Awaitable[None]] | None = None,
                 policy: FetchPolicy = DEFAULT_POLICY) -> None:
        self.host = host
        self.store = store
        self.streams_per_peer = streams_per_peer
        self.queue_chunks = queue_chunks
        self.pipeline = pipeline
        self.on_bad_peer = on_bad_peer
        self.policy = policy

    async def pick_manifest(self, artifact_id: str, peers: Sequence[ID], stats: FetchStats,
                            max_size: int, exclude: set[str] | None = None,
                            found: _ManifestRound | None = None) -> tuple[Manifest, list[ID]]:
        """The first good manifest wins: ask every provider at once, and once one
        answers, give the others `manifest_grace_s` more, then decide among what
        arrived (most providers, then the smaller size). A provider that answers
        after that still gets checked by its reader before it serves any chunk.

        A manifest claiming more than `max_size` bytes, or one that already failed
        the whole-file hash (`exclude`), is refused before any download starts.
        """
        exclude = exclude or set()
        found = found if found is not None else _ManifestRound()
        first = trio.Event()
        left = len(peers)

        async def ask(peer: ID) -> None:
            client: ArtifactClient | None = None
            try:
                client = await ArtifactClient.open(self.host, peer, self.policy)
                m = await client.manifest(artifact_id)
                if m.size > max_size:
                    raise PeerMisbehaved(f"claims {m.size} bytes for {artifact_id[:12]}, over "
                                         f"the {max_size} expected at most")
                found.by_peer[peer] = m
                if m.manifest_hash not in exclude:
                    found.clients[peer], client = client, None  # its reader reuses the stream
                    first.set()
            except PeerMisbehaved as exc:
                await self._bad(peer, str(exc), stats, slow=isinstance(exc, PeerTooSlow))
            except Exception as exc:
                stats.failed_peers[peer.to_base58()] = repr(exc)
                log.info("manifest_failed", peer=peer.to_base58(), error=repr(exc))
            finally:
                nonlocal left
                left -= 1
                if left == 0:  # everyone answered: no need to wait out the grace
                    nursery.cancel_scope.cancel()
                if client is not None:
                    with trio.CancelScope(shield=True), trio.move_on_after(2):
                        await client.close()

        async with trio.open_nursery() as nursery:
            for p in peers:
                nursery.start_soon(ask, p)

            async def decide() -> None:
                await first.wait()
                await trio.sleep(self.policy.manifest_grace_s)
                nursery.cancel_scope.cancel()

            nursery.start_soon(decide)
        good = {p: m for p, m in found.by_peer.items() if m.manifest_hash not in exclude}
        if not good:
            raise PeerUnavailable(
                f"no provider served a usable manifest of {artifact_id}: "
                f"{stats.failed_peers or 'all claims refused'}")
        votes = Counter(m.manifest_hash for m in good.values())
        size_of = {m.manifest_hash: m.size for m in good.values()}
        prev = self.store.part_manifest(artifact_id)
        if prev is not None and votes.get(prev.manifest_hash):
            best = prev.manifest_hash  # keep the chunks we already verified
        else:
            best = min(votes, key=lambda h: (-votes[h], size_of[h], h))
        manifest = next(m for m in good.values() if m.manifest_hash == best)
        if len(votes) > 1:
            log.warning("manifests_disagree", artifact=artifact_id, chosen=best[:12],
                        claims={h[:12]: size_of[h] for h in votes})
        return manifest, found.sources(best)

    async def fetch(self, artifact_id: str, peers: Sequence[ID],
                    progress: Progress | None = None,
                    expected_size: int | None = None) -> FetchStats:
        """Download `artifact_id` from `peers` into the store. Idempotent and resumable.

        `expected_size` (if the caller knows it, an upper bound) refuses bigger
        claims before any byte is downloaded; the store limit always applies. When
        the assembled file fails its hash, the manifest lied: the providers that
        served it are banned and another provider's manifest is tried, so no
        artifact is downloaded twice under the same lie.
        """
        stats = FetchStats()
        if self.store.has(artifact_id):
            return stats
        if not peers:
            raise PeerUnavailable(f"no providers known for {artifact_id}")
        max_size = self.store.max_size if expected_size is None else min(
            expected_size, self.store.max_size)
        failed_manifests: set[str] = set()
        candidates = list(peers)
        for _ in range(self.MAX_MANIFEST_ROUNDS):
            found = _ManifestRound()
            try:
                manifest, sources = await self.pick_manifest(
                    artifact_id, candidates, stats, max_size, failed_manifests, found)
                stats.manifests_tried += 1
                ok = await self._download(manifest, candidates, found, stats, progress)
            finally:
                await found.close()
            if ok:
                # The hash proved this manifest right: whoever claimed another one lied.
                for peer, m in found.by_peer.items():
                    if m.manifest_hash != manifest.manifest_hash:
                        await self._bad(peer, f"served a false manifest of {artifact_id[:12]}",
                                        stats)
                log.info("artifact_fetched", artifact=artifact_id, size=manifest.size,
                         per_peer=dict(stats.chunks_fetched),
                         resumed_chunks=stats.resumed_chunks, reissued=stats.reissued_chunks)
                return stats
            failed_manifests.add(manifest.manifest_hash)
            liars = set(sources) | {p for p, m in found.by_peer.items()
                                    if m.manifest_hash == manifest.manifest_hash}
            for peer in liars:
                await self._bad(peer, f"its manifest of {artifact_id[:12]} fails the whole-file "
                                      "hash", stats)
            candidates = [p for p in candidates if p not in liars]
            if not candidates:
                break
        # Failed for good: no manifest left to resume under; drop what is on disk.
        await trio.to_thread.run_sync(self.store.discard_partial, artifact_id)
        raise PeerUnavailable(f"every manifest of {artifact_id} offered was false "
                              f"({len(failed_manifests)} tried); no honest provider left")

    async def _download(self, manifest: Manifest, peers: Sequence[ID], found: _ManifestRound,
                        stats: FetchStats, progress: Progress | None) -> bool:
        """Fetch every chunk of `manifest`; True when the whole file checked out."""
        part = await trio.to_thread.run_sync(self.store.begin_download, manifest)
        try:
            missing = await trio.to_thread.run_sync(part.missing)
            stats.resumed_chunks = manifest.chunk_count - len(missing)
            work = _Work(missing)
            if missing:
                await self._run(manifest, part, work, peers, found, stats, progress)
            if work.missing:
                raise PeerUnavailable(
                    f"{len(work.missing)} of {manifest.chunk_count} chunks of "
                    f"{manifest.artifact_id} could not be fetched "
                    f"({stats.failed_peers or 'no provider left'}); "
                    "verified chunks are kept: fetch again to resume")
            try:
                await trio.to_thread.run_sync(part.finish)
            except IntegrityError as exc:
                log.warning("manifest_lied", artifact=manifest.artifact_id, error=str(exc))
                return False
            return True
        finally:
            await trio.to_thread.run_sync(part.close)

    async def _run(self, manifest: Manifest, part: PartialDownload, work: _Work,
                   peers: Sequence[ID], found: _ManifestRound, stats: FetchStats,
                   progress: Progress | None) -> None:
        send, recv = trio.open_memory_channel[tuple[int, bytes, ID]](self.queue_chunks)
        verified = manifest.size - sum(manifest.chunk_range(i)[1] for i in work.missing)
        banned: set[ID] = set()
        checked: dict[ID, bool] = {p: m.manifest_hash == manifest.manifest_hash
                                   for p, m in found.by_peer.items()}
        readers_scope = trio.CancelScope()
        if progress:
            progress(verified, manifest.size)

        async def writer() -> None:
            nonlocal verified
            async for index, data, peer in recv:
                if index not in work.missing:
                    continue  # an endgame duplicate: the other copy won
                try:
                    await trio.to_thread.run_sync(part.write_chunk, index, data)
                except IntegrityError as exc:
                    work.give_back(index, peer)
                    if peer not in banned:
                        banned.add(peer)
                        await self._bad(peer, str(exc), stats)
                    continue
                if not work.done(index):
                    continue
                stats.chunks_fetched[peer.to_base58()] += 1
                verified += len(data)
                if progress:
                    progress(verified, manifest.size)
                if not work.missing:
                    readers_scope.cancel()  # stragglers' duplicates are not needed

        async def reader(peer: ID) -> None:
            # Requests are pipelined: the next ones are on the wire while a chunk
            # arrives, so the stream never idles for a round trip.
            client: ArtifactClient | None = found.clients.pop(peer, None)
            pending: deque[tuple[int, dict[str, Any]]] = deque()
            try:
                if client is None:
                    client = await ArtifactClient.open(self.host, peer, self.policy)
                if peer not in checked:  # never answered the manifest: ask on this stream
                    m = await client.manifest(manifest.artifact_id)
                    found.by_peer[peer] = m
                    checked[peer] = m.manifest_hash == manifest.manifest_hash
                if not checked[peer]:
                    stats.failed_peers[peer.to_base58()] = "serves another manifest"
                    return
                while peer not in banned and work.missing:
                    while len(pending) < self.pipeline \
                            and (index := work.take(peer)) is not None:
                        req = client.read_request(manifest.artifact_id,
                                                  *manifest.chunk_range(index))
                        pending.append((index, req))
                        await client.send(req)
                    if not pending:
                        await work.changed.wait()
                        continue
                    data = await client.receive_range(pending[0][1])
                    index = pending.popleft()[0]
                    await send.send((index, data, peer))
            except PeerMisbehaved as exc:
                banned.add(peer)
                await self._bad(peer, str(exc), stats, slow=isinstance(exc, PeerTooSlow))
            except (trio.Cancelled, KeyboardInterrupt):
                raise
            except BaseException as exc:  # stream reset, peer died, refused, ...
                if _only_cancelled(exc):
                    raise
                stats.failed_peers[peer.to_base58()] = repr(exc)
                log.info("provider_failed", peer=peer.to_base58(), error=repr(exc))
            finally:
                for index, _ in pending:
                    work.give_back(index, peer)
                if client is not None:
                    stats.bytes_received += client.bytes_received
                    with trio.CancelScope(shield=True), trio.move_on_after(2):
                        await client.close()

        async with trio.open_nursery() as outer:
            outer.start_soon(writer)
            async with send:
                with readers_scope:
                    async with trio.open_nursery() as readers:
                        n = max(1, self.streams_per_peer)
                        for peer in peers:
                            for _ in range(n):
                                readers.start_soon(reader, peer)
        stats.reissued_chunks += work.reissued
        await trio.to_thread.run_sync(part.sync)

    async def _bad(self, peer: ID, why: str, stats: FetchStats, slow: bool = False) -> None:
        if peer.to_base58() in stats.bad_peers:
            return
        stats.bad_peers.add(peer.to_base58())
        log.warning("peer_too_slow" if slow else "peer_misbehaved", peer=peer.to_base58(),
                    reason=why)
        if self.on_bad_peer is not None:
            await self.on_bad_peer(peer, why, slow)
