"""`PolnetNode`: one libp2p host (TCP + Noise + Yamux) with pubsub, DHT and our protocol.

    async with PolnetNode(home, P2PSettings()) as node:      # inside trio.run
        aid = await node.publish_file("ckpt.safetensors")     # store + DHT provide
        await node.fetch(aid)                                 # DHT lookup + parallel fetch
        await node.announce("artifact_available", {"artifact_ids": [aid]})

Everything runs on the caller's trio loop; blocking work goes to threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost, IMuxedConn
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.tools.anyio_service import background_trio_service
from pydantic import BaseModel

from node.errors import P2PError, PeerUnavailable
from node.logs import get_logger
from node.p2p.announce import Announcement, AnnouncementVerifier, make_announcement, topic_of
from node.p2p.announce_policy import ReplayGuard
from node.p2p.config import DEFAULT_LISTEN, P2PSettings
from node.p2p.identity import load_or_create_keypair
from node.p2p.identity_lock import hold_identity
from node.p2p.limits import TokenBucket
from node.p2p.nat import NatManager, is_circuit, is_private_only
from node.p2p.transfer import ArtifactServer, Downloader, FetchStats, Progress
from node.p2p.wire import PROTOCOL_ID as ARTIFACT_PROTOCOL
from node.store import ArtifactStore

log = get_logger(__name__)
PRIVATE_DIAL_S = 4.0  # a direct dial of private-only addresses before relays are tried
PeerSpec = tuple[str, Sequence[str]]  # (peer id base58, multiaddrs) as the registry holds them


def make_host(key_pair: KeyPair, listen: str = DEFAULT_LISTEN) -> IHost:
    """A bare libp2p host speaking what our nodes speak (TCP + Noise + Yamux)."""
    return new_host(
        key_pair=key_pair,
        sec_opt={NOISE_ID: NoiseTransport(
            key_pair, noise_privkey=create_x25519_key_pair().private_key)},
        muxer_opt={TProtocol(YAMUX_ID): cast("type[IMuxedConn]", Yamux)},
        listen_addrs=[multiaddr.Multiaddr(listen)],
    )


class BanList:
    """Peers we do not fetch from, each until its ban runs out (bounded in size)."""

    MAX = 4096

    def __init__(self, ban_s: float) -> None:
        self.ban_s = ban_s
        self._until: dict[ID, float] = {}

    def add(self, peer: ID, seconds: float | None = None) -> None:
        """Ban `peer` for `seconds` (default `ban_s`); an existing longer ban stays."""
        if len(self._until) >= self.MAX:
            self._expire()
            while len(self._until) >= self.MAX:
                del self._until[next(iter(self._until))]
        until = time.monotonic() + (self.ban_s if seconds is None else seconds)
        until = max(until, self._until.pop(peer, 0.0))
        self._until[peer] = until

    def remaining(self, peer: ID) -> float:
        """Seconds `peer` stays banned (0 when it is not)."""
        return max(0.0, self._until.get(peer, 0.0) - time.monotonic())

    def discard(self, peer: ID) -> None:
        self._until.pop(peer, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for p in [p for p, t in self._until.items() if t <= now]:
            del self._until[p]

    def __contains__(self, peer: object) -> bool:
        t = self._until.get(peer)  # type: ignore[call-overload]
        if t is None:
            return False
        if t <= time.monotonic():
            del self._until[peer]  # type: ignore[arg-type]
            return False
        return True

    def __len__(self) -> int:
        self._expire()
        return len(self._until)


@dataclass
class _CountedLock:
    lock: trio.Lock = field(default_factory=trio.Lock)
    users: int = 0


class PolnetNode:
    """A node keeping its key (``p2p.key``) and store (``store/``) in ``home``:
    the same directory is the same identity."""

    def __init__(self, home: str | os.PathLike[str], config: P2PSettings | None = None,
                 store: ArtifactStore | None = None) -> None:
        self.home = Path(home)
        self.config = config = config or P2PSettings()
        self.store = store or ArtifactStore(self.home / "store", config.max_artifact_size)
        self.key_pair = load_or_create_keypair(self.home / "p2p.key")
        self.host: IHost = make_host(self.key_pair, config.listen)
        self.peer_id: ID = self.host.get_id()
        self.gossipsub = GossipSub(
            protocols=[PROTOCOL_ID_V11, PROTOCOL_ID], degree=6, degree_low=4, degree_high=12,
            heartbeat_initial_delay=0.2, heartbeat_interval=config.gossip_heartbeat_s,
            eclipse_protection_enabled=not config.gossip_single_ip_ok,
            max_messages_per_topic_per_second=config.gossip_receive_rate,
        )
        self.pubsub = Pubsub(self.host, self.gossipsub)
        self.dht = KadDHT(self.host, DHTMode.SERVER)
        self.server = ArtifactServer(self.store, config.serve)
        self.verifier = AnnouncementVerifier()
        self.replay = ReplayGuard()
        self.banned = BanList(config.ban_s)
        self.nat = NatManager(self.host, config.nat, config.bootstrap,
                              on_change=self._announce_circuits)
        self._fetching: dict[str, _CountedLock] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._seq = 0
        self._stack: AsyncExitStack | None = None
        self.nursery: trio.Nursery | None = None

    # --- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> PolnetNode:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            stack.enter_context(hold_identity(self.home))
            await stack.enter_async_context(
                self.host.run(listen_addrs=[multiaddr.Multiaddr(self.config.listen)]))
            self.nursery = await stack.enter_async_context(trio.open_nursery())
            await stack.enter_async_context(background_trio_service(self.pubsub))
            await stack.enter_async_context(background_trio_service(self.gossipsub))
            await self.pubsub.wait_until_ready()
            await stack.enter_async_context(background_trio_service(self.dht))
            self.host.set_stream_handler(ARTIFACT_PROTOCOL, self.server.handle)
            stack.push_async_callback(self._cancel_nursery)
            await self.nat.run(self.nursery)
            self.nursery.start_soon(self._learn_circuits)
            for addr in self.config.bootstrap:
                await self._try_connect(addr)
        except BaseException:
            await stack.__aexit__(None, None, None)
            raise
        self._stack = stack
        log.info("node_started", peer_id=self.peer_id.to_base58(), addrs=self.addrs)
        if self.addrs:  # what another node passes to --bootstrap, on a line of its own
            log.info("bootstrap_with", multiaddr=self.addrs[0])
        return self

    async def _cancel_nursery(self) -> None:
        if self.nursery is not None:
            self.nursery.cancel_scope.cancel()

    async def __aexit__(self, *exc: object) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                try:
                    await stack.aclose()
                except BaseException as err:  # noqa: BLE001 - filtered, the rest re-raised
                    rest = _without_shutdown_races(err)
                    if rest is not None:
                        raise rest from None
                    log.info("p2p_shutdown_race_ignored", error=repr(err)[:200])

    @property
    def addrs(self) -> list[str]:
        """Our listen multiaddrs including /p2p/<peer id>, ready to give to others, then
        our relayed (/p2p-circuit) addresses while we hold relay reservations."""
        pid = self.peer_id.to_base58()
        return [f"{a}/p2p/{pid}" if "/p2p/" not in str(a) else str(a)
                for a in self.host.get_addrs()] + self.nat.circuit_addrs

    # --- NAT: relayed addresses -----------------------------------------------------

    async def _announce_circuits(self) -> None:
        """Tell the network how to reach us through our relays (on every change)."""
        addrs = self.nat.circuit_addrs
        if not addrs:
            return
        try:
            await self.announce("peer_addrs", {"addrs": addrs})
        except Exception as exc:  # announced again on the next change or round
            log.info("peer_addrs_announce_failed", error=repr(exc))

    async def _learn_circuits(self) -> None:
        """Keep the relayed addresses other nodes announce; re-announce ours now and
        then so that nodes joining later learn them too."""
        chan = await self.subscribe("peer_addrs")

        async def reannounce() -> None:
            for _ in range(10**9):  # bounded by the node's life: each pass sleeps
                await trio.sleep(30.0)
                await self._announce_circuits()

        assert self.nursery is not None
        self.nursery.start_soon(reannounce)
        async for ann in chan:
            try:
                sender = ID.from_base58(ann.sender)
            except Exception:
                continue
            if sender != self.peer_id and self.nat.learn_circuits(
                    sender, list(ann.payload.get("addrs", []))):
                log.debug("peer_circuits_learned", peer=ann.sender)

    # --- discovery ------------------------------------------------------------------

    async def connect(self, maddr: str) -> ID:
        """Dial a full multiaddr (/ip4/../tcp/../p2p/<id>); adds the peer to the DHT."""
        info = info_from_p2p_addr(multiaddr.Multiaddr(maddr))
        await self._dial(info)
        return info.peer_id

    async def _dial(self, info: PeerInfo) -> None:
        """Connect to a peer: directly, else through a relay. Relays are tried when the
        direct dial fails and the peer announced relayed addresses (or was given one),
        or when all it gives are private (RFC 1918 / CGNAT) addresses: a node at home."""
        if info.peer_id == self.peer_id:
            return
        direct = [a for a in info.addrs if not is_circuit(a)]
        pid = info.peer_id.to_base58()
        given = [str(a) if str(a).endswith(f"/p2p/{pid}") else f"{a}/p2p/{pid}"
                 for a in info.addrs if is_circuit(a)]
        connected = info.peer_id in self.host.get_connected_peers()
        try:
            if not direct and not connected:
                raise PeerUnavailable(f"no direct address for {info.peer_id}")
            if direct and not connected:
                # Fresh addresses replace stale ones (a restarted peer has a new port),
                # and lift the swarm's "recently failed" block on the peer.
                self.host.get_peerstore().clear_addrs(info.peer_id)
                unblock = getattr(self.host.get_network(), "unblock_peer", None)
                if unblock is not None:
                    unblock(info.peer_id)
            self.host.get_peerstore().add_addrs(info.peer_id, direct, 3600)
            # A home node's private address answers at once on its own network or
            # never (the swarm retries unreachable routes): relays are tried sooner.
            with trio.fail_after(PRIVATE_DIAL_S if is_private_only(direct) else 15):
                await self.host.connect(PeerInfo(info.peer_id, direct))
        except Exception as exc:
            via_relay = given or self.nat.known_circuits.get(info.peer_id) \
                or is_private_only(direct)
            circuits = self.nat.circuits_for(info.peer_id, given) if via_relay else []
            if not circuits:
                raise
            log.info("direct_dial_failed", peer=info.peer_id.to_base58(), error=repr(exc)[:200],
                     trying_relays=len(circuits))
            await self.nat.dial_circuit(info.peer_id, circuits)
        await self.dht.add_peer(info.peer_id, skip_server_mode_check=True)

    async def _try_connect(self, maddr: str) -> bool:
        try:
            await self.connect(maddr)
            return True
        except Exception as exc:
            log.warning("dial_failed", addr=maddr, error=repr(exc))
            return False

    async def add_registry_peers(self, peers: Iterable[PeerSpec], connect: bool = True) -> int:
        """Learn peers from the on-chain registry: (peer id, [multiaddr, ...]) tuples.

        Returns how many were reachable (or recorded, with connect=False).
        """
        n = 0
        for pid_str, maddrs in peers:
            try:
                pid = ID.from_base58(pid_str)
                addrs = [multiaddr.Multiaddr(a.split("/p2p/")[0]) for a in maddrs]
            except Exception as exc:
                log.warning("registry_peer_invalid", peer=pid_str, error=repr(exc))
                continue
            if pid == self.peer_id or not addrs:
                continue
            if not connect:
                self.host.get_peerstore().add_addrs(pid, addrs, 3600)
                n += 1
                continue
            try:
                await self._dial(PeerInfo(pid, addrs))
                n += 1
            except Exception as exc:
                log.info("registry_peer_unreachable", peer=pid_str, error=repr(exc))
        return n

    def set_staked(self, peer_ids: Iterable[str]) -> None:
        """Peer ids of nodes with slashable stake (from the chain): served from the
        reserved slots. A registration alone costs only gas and earns nothing here."""
        self.server.set_staked(set(peer_ids))

    def set_seats(self, peer_ids: Iterable[str]) -> None:
        """Peer ids seated on the committee or jury of a live dispute (and its
        parties): they may take any slot but another seat's."""
        self.server.set_seats(set(peer_ids))

    def registry_hook(self) -> Callable[[Iterable[PeerSpec]], int]:
        """A plain function for a worker thread (e.g. a web3 poller) to feed registry peers."""
        token = trio.lowlevel.current_trio_token()

        def hook(peers: Iterable[PeerSpec]) -> int:
            return trio.from_thread.run(self.add_registry_peers, list(peers), trio_token=token)

        return hook

    async def discover(self) -> list[ID]:
        """Walk the DHT towards our own id: fills the routing table from the bootstrap peers."""
        found = await self.dht.peer_routing.find_closest_peers_network(self.peer_id.to_bytes())
        for pid in found:
            if pid != self.peer_id and pid not in self.host.get_connected_peers():
                addrs = self.host.get_peerstore().addrs(pid)
                if addrs:
                    try:
                        await self._dial(PeerInfo(pid, addrs))
                    except Exception as exc:
                        log.info("discover_dial_failed", peer=pid.to_base58(), error=repr(exc))
        return [p for p in self.host.get_connected_peers() if p != self.peer_id]

    async def find_peer(self, peer_id: str) -> PeerInfo | None:
        return await self.dht.find_peer(ID.from_base58(peer_id))

    # --- artifacts ------------------------------------------------------------------

    async def provide(self, artifact_id: str) -> bool:
        """Advertise in the DHT that we serve `artifact_id`."""
        if not self.store.has(artifact_id):
            raise P2PError(f"cannot provide {artifact_id}: not in the local store")
        return bool(await self.dht.provide(artifact_id))

    async def publish_file(self, path: str | os.PathLike[str]) -> str:
        """Store a file and advertise it; returns its artifact id."""
        aid = await trio.to_thread.run_sync(self.store.put_file, path)
        await self.provide(aid)
        return aid

    async def publish_bytes(self, data: bytes) -> str:
        aid = await trio.to_thread.run_sync(self.store.put_bytes, data)
        await self.provide(aid)
        return aid

    async def find_providers(self, artifact_id: str, count: int = 20) -> list[PeerInfo]:
        """Providers from the DHT, de-duplicated, without ourselves or banned peers."""
        seen: dict[ID, PeerInfo] = {}
        for info in await self.dht.find_providers(artifact_id, count):
            if info.peer_id == self.peer_id or info.peer_id in self.banned:
                continue
            prev = seen.get(info.peer_id)
            addrs = list(dict.fromkeys([*(prev.addrs if prev else []), *info.addrs]))
            seen[info.peer_id] = PeerInfo(info.peer_id, addrs)
        return list(seen.values())

    async def fetch(self, artifact_id: str, peers: Sequence[str] | None = None,
                    progress: Progress | None = None, provide: bool = True,
                    expected_size: int | None = None) -> FetchStats:
        """Fetch an artifact into the local store.

        `peers`: multiaddrs to fetch from; by default providers come from the DHT.
        `expected_size`: an upper bound on the size, when the caller knows one (a
        bigger claim is refused before any download). Resumes an interrupted
        download. Raises PeerUnavailable when no provider could finish it (the
        verified chunks stay for the next try).
        """
        # One download per artifact at a time: two would assemble the same .part file
        # (one finishing and discarding it under the other), fail the whole-file hash
        # and ban honest providers. The second caller waits and finds it stored.
        lock = self._fetching.get(artifact_id)
        if lock is None:
            lock = self._fetching[artifact_id] = _CountedLock()
        lock.users += 1
        try:
            async with lock.lock:
                return await self._fetch_once(artifact_id, peers, progress, provide,
                                              expected_size)
        finally:
            lock.users -= 1
            if lock.users == 0:
                del self._fetching[artifact_id]

    async def _fetch_once(self, artifact_id: str, peers: Sequence[str] | None,
                          progress: Progress | None, provide: bool,
                          expected_size: int | None) -> FetchStats:
        if self.store.has(artifact_id):
            return FetchStats()
        infos: list[PeerInfo] = []
        if peers:
            for a in peers:
                infos.append(info_from_p2p_addr(multiaddr.Multiaddr(a)))
        else:
            infos = await self.find_providers(artifact_id)
        reachable = await self._dial_all(
            [i for i in infos if i.peer_id not in self.banned and i.peer_id != self.peer_id])
        if not reachable:
            raise PeerUnavailable(f"no reachable provider for {artifact_id}")
        dl = Downloader(self.host, self.store, self.config.streams_per_peer,
                        on_bad_peer=self._drop_peer, policy=self.config.fetch)
        stats = await dl.fetch(artifact_id, reachable, progress, expected_size)
        if provide:
            # Advertising is best effort and a DHT walk can take its 10 s query timeout
            # (a peer that never answers): do it in the background, never in the fetch.
            try:
                if self.nursery is None:
                    raise RuntimeError("node not running")
                self.nursery.start_soon(self._provide_quietly, artifact_id)
            except RuntimeError:  # shutting down: nobody will ask us for it anyway
                log.info("provide_skipped", artifact=artifact_id, reason="node stopping")
        return stats

    async def _provide_quietly(self, artifact_id: str) -> None:
        try:
            await self.provide(artifact_id)
        except Exception as exc:  # we have it; advertising is best effort
            log.info("provide_failed", artifact=artifact_id, error=repr(exc))

    async def _dial_all(self, infos: Sequence[PeerInfo]) -> list[ID]:
        """Dial providers at once, each within the open timeout; the reachable, in order."""
        ok: set[ID] = set()
        merged: dict[ID, PeerInfo] = {}
        for info in infos:
            prev = merged.get(info.peer_id)
            addrs = list(dict.fromkeys([*(prev.addrs if prev else []), *info.addrs]))
            merged[info.peer_id] = PeerInfo(info.peer_id, addrs)

        async def dial(info: PeerInfo) -> None:
            try:
                with trio.fail_after(self.config.fetch.open_timeout_s):
                    await self._dial(info)
                ok.add(info.peer_id)
            except Exception as exc:
                log.info("provider_unreachable", peer=info.peer_id.to_base58(), error=repr(exc))

        async with trio.open_nursery() as nursery:
            for info in list(merged.values())[:32]:
                nursery.start_soon(dial, info)
        return [p for p in merged if p in ok]

    async def _drop_peer(self, peer: ID, why: str, slow: bool = False) -> None:
        # Slow is not false: a provider that missed a deadline (perhaps the one solver
        # who holds a job's trace, on a bad minute) is asked again soon; one that sent
        # something false is not asked for `ban_s`.
        ban_s = min(self.config.slow_ban_s, self.banned.ban_s) if slow else self.banned.ban_s
        self.banned.add(peer, ban_s)
        log.warning("peer_dropped", peer=peer.to_base58(), reason=why, ban_s=ban_s)
        try:
            await self.host.disconnect(peer)
        except Exception as exc:
            log.info("disconnect_failed", peer=peer.to_base58(), error=repr(exc))

    # --- announcements --------------------------------------------------------------

    async def announce(self, kind: str, payload: BaseModel | dict[str, Any]) -> None:
        """Sign and publish an announcement, paced per topic (waits rather than drops)."""
        topic = topic_of(kind)
        self._seq += 1
        raw = make_announcement(self.key_pair.private_key, self.peer_id, kind, payload, self._seq)
        bucket = self._buckets.get(topic)
        if bucket is None:
            bucket = self._buckets[topic] = TokenBucket(self.config.announce_rate,
                                                        self.config.announce_burst)
        await bucket.take()
        await self.pubsub.publish(topic, raw)

    async def subscribe(self, kind: str,
                        buffer: int = 256) -> trio.MemoryReceiveChannel[Announcement]:
        """Verified announcements of `kind`, on a channel of our own.

        A task drains the gossipsub subscription at once (it silently drops past
        32 unread); if our buffer fills, the oldest-pending message is counted as
        dropped ("overflow") instead of blocking the router.
        """
        if self.nursery is None:
            raise P2PError("node is not running: use `async with PolnetNode(...)`")
        topic = topic_of(kind)
        self.pubsub.set_topic_validator(topic, self._validator(topic), False)
        sub = await self.pubsub.subscribe(topic)
        send, recv = trio.open_memory_channel[Announcement](buffer)

        async def pump() -> None:
            async with send:
                async for msg in _messages(sub):
                    ann = self.verifier.verify(msg.data, topic, ID(msg.from_id))
                    if ann is None or ann.kind != kind:
                        continue
                    replay = self.replay.check(ann)
                    if replay:  # stale, from the future, or seen before
                        self.verifier.dropped[replay] += 1
                        continue
                    try:
                        send.send_nowait(ann)
                    except trio.WouldBlock:
                        self.verifier.dropped["overflow"] += 1
                    except trio.BrokenResourceError:
                        return

        self.nursery.start_soon(pump)
        return recv

    def _validator(self, topic: str) -> Callable[[ID, Any], bool]:
        probe = AnnouncementVerifier()

        def validate(_forwarder: ID, msg: Any) -> bool:
            # Reject before gossipsub forwards it; count drops on the node's verifier.
            reason, ann = probe._check(msg.data, topic, ID(msg.from_id))
            if ann is not None:
                reason = self.replay.fresh(ann)  # old ones are not forwarded either
            if reason:
                self.verifier.dropped[reason] += 1
            return not reason

        return validate

    async def wait_for_topic_peers(self, kind: str, n: int, timeout: float = 10) -> None:
        """Wait until `n` peers subscribe to `kind`'s topic (so a publish reaches them)."""
        topic = topic_of(kind)
        with trio.fail_after(timeout):
            while len(self.pubsub.peer_topics.get(topic, set())) < n:
                await trio.sleep(0.05)


async def _messages(sub: Any) -> AsyncIterator[Any]:
    while True:
        yield await sub.get()


def _is_shutdown_race(err: BaseException) -> bool:
    """py-libp2p 0.8 schedules pubsub reads on a service that is already stopping (a
    peer's message arriving while we close): the node's work is done, nothing is lost."""
    return isinstance(err, RuntimeError) and "Nursery is closed to new arrivals" in str(err) \
        or type(err).__name__ == "LifecycleError"


def _without_shutdown_races(err: BaseException) -> BaseException | None:
    """``err`` without libp2p's shutdown races (None if nothing else is left)."""
    if isinstance(err, BaseExceptionGroup):
        _, rest = err.split(_is_shutdown_race)
        return rest
    return None if _is_shutdown_race(err) else err
