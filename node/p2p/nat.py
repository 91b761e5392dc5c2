"""Nodes behind NAT: reachability (dial-back), circuit relay v2 service and client.

**Reachability.** py-libp2p 0.8's AutoNAT answers a dial-back request with
``host.connect(peer)``, which returns the connection the request itself came in
on: every asker is told it is public. We ask over our own protocol
(``/polnet/reach/1.0.0``) instead: the peer opens a *fresh TCP connection* to the
asker's observed IP at each listen port the asker names (never another IP: no
amplification) and speaks multistream-select's first line; only an answer from a
libp2p listener counts. One confirmation makes a node ``public``; answers that
all failed make it ``private``; no answer leaves it ``unknown``.

**Relays.** A relay serves py-libp2p's circuit relay v2 hop protocol with our
limits: reservations, circuits per reservation, bytes and duration per circuit,
and bandwidth (per circuit and in total, which py-libp2p lacks: added here by
pacing the relay's reads). A private node reserves a slot on up to
``max_relays`` relays (its configured ``relays``, then its bootstrap peers),
keeps the reservations fresh, and publishes its ``/p2p-circuit`` addresses.
py-libp2p's swarm never dials ``/p2p-circuit`` addresses, so :meth:`NatManager.
dial_circuit` dials them through the circuit transport itself; PolnetNode falls
back to it when a direct dial fails. Whatever crosses a relay is still Noise
encrypted end to end and checked against content hashes; fetch deadlines and
bans apply as on a direct connection.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

from node.errors import P2PError, PeerMisbehaved
from node.logs import get_logger
from node.p2p.config import NatSettings
from node.p2p.limits import TokenBucket
from node.p2p.wire import StreamClosed, encode_frame, read_frame

log = get_logger(__name__)

REACH_PROTOCOL = TProtocol("/polnet/reach/1.0.0")
MULTISTREAM = b"/multistream/1.0.0\n"
RELAY_READ = 1024 * 1024  # bytes a relay reads from one side of a circuit at a time
Status = Literal["unknown", "public", "private"]
STATUS_VALUE: dict[str, int] = {"unknown": -1, "private": 0, "public": 1}


def is_circuit(addr: str | multiaddr.Multiaddr) -> bool:
    return "/p2p-circuit" in str(addr)


def is_private_only(addrs: Sequence[multiaddr.Multiaddr | str]) -> bool:
    """True when every address is an IPv4 one in a private (RFC 1918) or carrier-grade
    NAT (100.64.0.0/10) range: a node behind NAT that others cannot dial."""
    import ipaddress  # noqa: PLC0415

    home = [ipaddress.ip_network(n) for n in
            ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")]
    seen = False
    for a in addrs:
        parts = str(a).split("/")
        if len(parts) < 3 or parts[1] != "ip4":
            return False
        try:
            ip = ipaddress.ip_address(parts[2])
        except ValueError:
            return False
        if not any(ip in net for net in home):
            return False
        seen = True
    return seen


def _observed_ip(stream: INetStream) -> str | None:
    try:
        addr = stream.get_remote_address()
    except Exception:
        return None
    return str(addr[0]) if addr else None


def _relayed(stream: INetStream) -> bool:
    try:
        addrs = stream.muxed_conn.get_transport_addresses()  # type: ignore[attr-defined]
    except Exception:
        return False
    return any(is_circuit(a) for a in addrs or [])


async def probe_listener(ip: str, port: int, timeout: float) -> bool:
    """A fresh TCP connection to ip:port that answers multistream-select's first line."""
    with trio.move_on_after(timeout):
        try:
            stream = await trio.open_tcp_stream(ip, port)
        except OSError:
            return False
        try:
            await stream.send_all(bytes([len(MULTISTREAM)]) + MULTISTREAM)
            got = b""
            while len(got) < 1 + len(MULTISTREAM):
                data = await stream.receive_some(64)
                if not data:
                    break
                got += data
            return MULTISTREAM in got
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
    return False


def _listen_ports(host: IHost) -> list[int]:
    ports: list[int] = []
    for a in host.get_addrs():
        if is_circuit(a):
            continue
        try:
            ports.append(int(a.value_for_protocol("tcp")))
        except Exception:
            continue
    return list(dict.fromkeys(ports))[:4]


class _PacedRelay(CircuitV2Protocol):
    """py-libp2p's hop relay, with bandwidth limits: every chunk it forwards is paid
    for from the circuit's own bucket and the relay's total bucket."""

    def __init__(self, host: IHost, limits: RelayLimits, circuit_bps: float,
                 total_bps: float) -> None:
        super().__init__(host, limits=limits, allow_hop=True)
        self.circuit_bps = circuit_bps
        self.total = TokenBucket(total_bps, max(total_bps / 4, 256 * 1024))
        self._per_stream: weakref.WeakKeyDictionary[Any, TokenBucket] = \
            weakref.WeakKeyDictionary()
        self.relayed_bytes = 0

    async def _read_stream_with_retry(self, stream: INetStream,
                                      max_retries: int = 3) -> bytes | None:
        # py-libp2p reads 64 KiB at a time and retries errors three times with sleeps;
        # yamux hands over whatever has arrived, so a bigger read costs nothing when
        # little is there and saves round trips through the loop when much is.
        try:
            data = await stream.read(RELAY_READ)
        except Exception:  # EOF, reset: the circuit is over
            return None
        if data:
            bucket = self._per_stream.get(stream)
            if bucket is None:
                bucket = TokenBucket(self.circuit_bps, max(self.circuit_bps / 4, 256 * 1024))
                self._per_stream[stream] = bucket
            await bucket.take(len(data))
            await self.total.take(len(data))
            self.relayed_bytes += len(data)
        return data

    async def _relay_data(self, src_stream: INetStream, dst_stream: INetStream, peer_id: ID,
                          deadline: float | None = None,
                          circuit_data_limit: list[int] | None = None) -> None:
        """One direction of one circuit. py-libp2p's own version cleans up through a
        table keyed by peer id, so a circuit ending closed the streams of another
        circuit to the same peer (two verifiers fetching from one solver): here each
        circuit closes only its own two streams."""
        try:
            for _ in range(10**12):  # ends with the stream, its deadline or its byte cap
                if deadline is not None and time.monotonic() > deadline:
                    log.info("relay_circuit_expired", peer=peer_id.to_base58())
                    break
                data = await self._read_stream_with_retry(src_stream)
                if not data:
                    break
                if circuit_data_limit is not None:
                    if len(data) > circuit_data_limit[0]:
                        log.info("relay_circuit_data_cap", peer=peer_id.to_base58())
                        break
                    circuit_data_limit[0] -= len(data)
                with trio.fail_after(self.write_timeout):
                    await dst_stream.write(data)
        except Exception as exc:  # the circuit ends; the relay goes on
            log.debug("relay_circuit_ended", peer=peer_id.to_base58(), error=repr(exc))
        finally:
            self._active_relays.pop(peer_id, None)
            await self._close_stream(dst_stream)
            await self._close_stream(src_stream)


@dataclass
class Reachability:
    """What the last dial-back round said about us."""

    status: Status = "unknown"
    confirmed_by: list[str] = field(default_factory=list)
    refuted_by: list[str] = field(default_factory=list)
    checked_at: float | None = None     # unix time of the last verdict
    public_since: float | None = None   # monotonic seconds from start to public/relayed

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "confirmed_by": self.confirmed_by,
                "refuted_by": self.refuted_by, "checked_at": self.checked_at}


class NatManager:
    """Reachability, the relay service and the relay client of one PolnetNode."""

    MAX_KNOWN_CIRCUITS = 4096

    def __init__(self, host: IHost, settings: NatSettings, bootstrap: Sequence[str],
                 on_change: Callable[[], Awaitable[None]] | None = None) -> None:
        self.host = host
        self.settings = settings
        self.bootstrap = list(bootstrap)
        self.on_change = on_change
        self.reach = Reachability()
        self.started = time.monotonic()
        self.relay_serving = settings.relay_service == "on" or (
            settings.relay_service == "auto" and not self.bootstrap)
        limits = RelayLimits(duration=settings.circuit_duration_s, data=settings.circuit_bytes,
                             max_circuit_conns=settings.max_circuits_per_peer,
                             max_reservations=settings.max_reservations,
                             reservation_ttl=settings.reservation_ttl_s)
        self.relay: _PacedRelay | None = (
            _PacedRelay(host, limits, settings.circuit_bps, settings.total_bps)
            if self.relay_serving else None)
        # Every node takes relayed connections (STOP); only relays serve HOP.
        self.stop = self.relay or CircuitV2Protocol(host, limits=limits, allow_hop=False)
        # Its dials reserve nothing (no CLIENT role); reservations are made by reserve().
        self.transport = CircuitV2Transport(
            host, self.stop, RelayConfig(roles=RelayRole.STOP, limits=limits))
        self.reservations: dict[ID, tuple[str, float]] = {}  # relay -> (its addr, expiry)
        self.known_circuits: OrderedDict[ID, list[str]] = OrderedDict()  # peers' announced
        self._asked: OrderedDict[ID, float] = OrderedDict()  # dial-back askers, last time
        self._serving = trio.Semaphore(2)
        self._changed = trio.Event()
        self.hole_punched: OrderedDict[str, None] = OrderedDict()  # relayed, then direct

    # --- lifecycle ------------------------------------------------------------------

    async def run(self, nursery: trio.Nursery) -> None:
        """Register handlers; start the check and reservation loops in `nursery`."""
        from libp2p.tools.anyio_service import background_trio_service  # noqa: PLC0415

        self.host.set_stream_handler(REACH_PROTOCOL, self.handle_dial_back)

        async def service() -> None:
            async with background_trio_service(self.stop):
                await trio.sleep_forever()

        nursery.start_soon(service)
        if self.settings.hole_punch:
            from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol  # noqa: PLC0415

            dcutr = DCUtRProtocol(self.host)

            async def punch() -> None:
                # py-libp2p's DCUtR drives itself: every 2 s it tries to upgrade each
                # relayed connection (3 attempts per peer), dialing from our listen port
                async with background_trio_service(dcutr):
                    await trio.sleep_forever()

            nursery.start_soon(punch)
            nursery.start_soon(self._watch_upgrades)
        if self.settings.reach_check:
            nursery.start_soon(self._check_loop)
        if self.settings.relay_client != "off":
            nursery.start_soon(self._reserve_loop)
        if self.relay_serving:
            log.info("relay_serving", max_reservations=self.settings.max_reservations,
                     circuit_bps=self.settings.circuit_bps, total_bps=self.settings.total_bps)

    @property
    def circuit_addrs(self) -> list[str]:
        """Our /p2p-circuit addresses, one per live reservation."""
        me = self.host.get_id().to_base58()
        now = time.time()
        return [f"{addr}/p2p-circuit/p2p/{me}" for addr, exp in self.reservations.values()
                if exp > now]

    def status(self) -> dict[str, Any]:
        out = self.reach.as_dict()
        out["relay_serving"] = self.relay_serving
        out["relay_addrs"] = self.circuit_addrs
        out["hole_punched"] = list(self.hole_punched)
        out["relayed_bytes"] = self.relay.relayed_bytes if self.relay else 0
        out["reservations_held"] = (len(self.relay.resource_manager._reservations)
                                    if self.relay else 0)
        return out

    async def _watch_upgrades(self) -> None:
        """Log (and count) peers whose relayed connection became a direct one."""
        relayed: OrderedDict[str, None] = OrderedDict()
        for _ in range(10**9):  # bounded by the node's life: each pass sleeps
            await trio.sleep(1.0)
            for pid, kind in connection_kinds(self.host).items():
                if kind == "relayed":
                    relayed[pid] = None
                    while len(relayed) > 4096:
                        relayed.popitem(last=False)
                elif pid in relayed:
                    del relayed[pid]
                    self.hole_punched[pid] = None
                    while len(self.hole_punched) > 64:
                        self.hole_punched.popitem(last=False)
                    log.info("hole_punched", peer=pid)

    # --- dial-back: server ------------------------------------------------------------

    async def handle_dial_back(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id
        try:
            if _relayed(stream):
                await stream.write(encode_frame({"ok": False, "error": "relayed"}))
                return
            with trio.fail_after(5):
                req = await read_frame(stream)
            ports = req.get("ports")
            ip = _observed_ip(stream)
            if ip is not None and is_private_only([f"/ip4/{ip}/tcp/1"]):
                # A neighbour on the asker's own private network: reaching it here says
                # nothing about the internet. (Loopback is answered: a devnet.)
                await stream.write(encode_frame({"ok": False, "error": "same_private_network"}))
                return
            last = self._asked.get(peer)
            now = trio.current_time()
            if not isinstance(ports, list) or not 1 <= len(ports) <= 4 \
                    or not all(type(p) is int and 0 < p < 65536 for p in ports) or ip is None:
                await stream.write(encode_frame({"ok": False, "error": "bad_request"}))
                return
            if last is not None and now - last < 5.0:
                await stream.write(encode_frame({"ok": False, "error": "rate_limited"}))
                return
            self._asked[peer] = now
            self._asked.move_to_end(peer)
            while len(self._asked) > 1024:
                self._asked.popitem(last=False)
            async with self._serving:
                reached = [p for p in ports
                           if await probe_listener(ip, p, self.settings.dial_back_timeout_s)]
            await stream.write(encode_frame({"ok": True, "reached": [
                f"/ip4/{ip}/tcp/{p}" for p in reached]}))
        except (PeerMisbehaved, EOFError, StreamClosed, trio.TooSlowError) as exc:
            log.info("dial_back_request_dropped", peer=peer.to_base58(), error=repr(exc))
        except Exception as exc:  # a broken stream must never take the node down
            log.info("dial_back_request_error", peer=peer.to_base58(), error=repr(exc))
        finally:
            with contextlib.suppress(Exception):
                await stream.close()

    # --- dial-back: client ------------------------------------------------------------

    async def ask_dial_back(self, peer: ID) -> bool | None:
        """True: `peer` reached one of our listen ports afresh; False: none; None: no
        usable answer (refused, rate limited, an old node without the protocol)."""
        ports = _listen_ports(self.host)
        if not ports:
            return None
        try:
            with trio.fail_after(self.settings.dial_back_timeout_s * len(ports) + 10):
                stream = await self.host.new_stream(peer, [REACH_PROTOCOL])
                try:
                    await stream.write(encode_frame({"op": "dialback", "ports": ports}))
                    ans = await read_frame(stream)
                finally:
                    with contextlib.suppress(Exception):
                        await stream.close()
        except Exception as exc:
            log.debug("dial_back_unanswered", peer=peer.to_base58(), error=repr(exc))
            return None
        if ans.get("ok") is not True or not isinstance(ans.get("reached"), list):
            return None
        return bool(ans["reached"])

    def _check_peers(self) -> list[ID]:
        """Peers to ask, those reached directly only (a relayed one would be refused):
        bootstrap peers first, at most 3."""
        boot: list[ID] = []
        for a in self.bootstrap:
            try:
                boot.append(info_from_p2p_addr(multiaddr.Multiaddr(a)).peer_id)
            except Exception:
                continue
        net = self.host.get_network()
        direct: list[ID] = []
        for pid in self.host.get_connected_peers():
            conns = net.get_connections(pid) if hasattr(net, "get_connections") else []
            if any(not _conn_relayed(c) for c in conns):
                direct.append(pid)
        ordered = [p for p in boot if p in direct] + [p for p in direct if p not in boot]
        return ordered[:3]

    async def check_once(self) -> Status:
        peers = self._check_peers()
        results: dict[ID, bool | None] = {}

        async def one(p: ID) -> None:
            results[p] = await self.ask_dial_back(p)

        async with trio.open_nursery() as n:
            for p in peers:
                n.start_soon(one, p)
        yes = [p.to_base58() for p, r in results.items() if r is True]
        no = [p.to_base58() for p, r in results.items() if r is False]
        new: Status = "public" if yes else "private" if no else "unknown"
        if new != "unknown" or self.reach.status == "unknown":
            changed = new != self.reach.status
            self.reach.status = new
            self.reach.confirmed_by, self.reach.refuted_by = yes, no
            if new != "unknown":
                self.reach.checked_at = time.time()
            if new == "public" and self.reach.public_since is None:
                self.reach.public_since = time.monotonic() - self.started
            if changed:
                log.info("reachability", status=new, confirmed_by=yes, refuted_by=no)
                self._poke()
        return new

    async def _check_loop(self) -> None:
        delay = 0.5
        for _ in range(10**9):  # bounded by the node's life: each pass sleeps
            await trio.sleep(delay)
            status: Status = "unknown"
            try:
                status = await self.check_once()
            except Exception as exc:  # checked again later; never fatal
                log.info("reachability_check_failed", error=repr(exc))
            # Ask again soon, backing off to reach_interval_s: one busy peer (or one busy
            # start of ours) is no verdict. Without one (no peer connected yet): every 10 s.
            cap = 10.0 if status == "unknown" else self.settings.reach_interval_s
            delay = min(cap, max(2.0, delay * 2))

    # --- relay client -------------------------------------------------------------------

    def _wants_relay(self) -> bool:
        mode = self.settings.relay_client
        return mode == "on" or (mode == "auto" and self.reach.status == "private")

    def _relay_candidates(self) -> list[str]:
        me = self.host.get_id()
        out = []
        for a in [*self.settings.relays, *self.bootstrap]:
            try:
                if info_from_p2p_addr(multiaddr.Multiaddr(a)).peer_id != me:
                    out.append(a)
            except Exception:
                continue
        return list(dict.fromkeys(out))

    async def reserve(self, relay_addr: str) -> bool:
        """Reserve a slot on the relay at `relay_addr` (a full multiaddr)."""
        info = info_from_p2p_addr(multiaddr.Multiaddr(relay_addr))
        with trio.fail_after(self.settings.circuit_open_timeout_s + 5):
            self.host.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)
            await self.host.connect(info)
            stream = await self.host.new_stream(info.peer_id, [HOP_PROTOCOL])
            try:
                ok = await self.transport._make_reservation(stream, info.peer_id)
            finally:
                with contextlib.suppress(Exception):
                    await stream.close()
        if not ok:
            return False
        expires = float(self.transport._reservations.get(info.peer_id, 0))
        base = relay_addr if "/p2p/" in relay_addr else f"{relay_addr}/p2p/{info.peer_id}"
        self.reservations[info.peer_id] = (base, expires)
        return True

    async def _reserve_loop(self) -> None:
        for _ in range(10**9):  # bounded by the node's life: each pass sleeps
            try:
                await self._reserve_pass()
            except Exception as exc:  # retried on the next pass; never fatal
                log.info("relay_reserve_pass_failed", error=repr(exc))
            with trio.move_on_after(self._next_pass_in()):
                await self._changed.wait()

    def _next_pass_in(self) -> float:
        if not self._wants_relay():
            return 30.0
        if len(self.reservations) < self.settings.max_relays:
            return 5.0
        soonest = min(exp for _, exp in self.reservations.values())
        return max(5.0, min(300.0, (soonest - time.time()) / 2))

    async def _reserve_pass(self) -> None:
        if not self._wants_relay():
            if self.reservations:  # found public after all: let the slots lapse
                self.reservations.clear()
                log.info("relay_addrs", addrs=[])
            return
        now = time.time()
        before = set(self.circuit_addrs)
        connected = set(self.host.get_connected_peers())
        for rid, (_, exp) in list(self.reservations.items()):
            if rid not in connected or exp - now < self.settings.reservation_ttl_s / 2:
                del self.reservations[rid]  # lost or due: reserved again below
        for addr in self._relay_candidates():
            if len(self.reservations) >= self.settings.max_relays:
                break
            try:
                rid = info_from_p2p_addr(multiaddr.Multiaddr(addr)).peer_id
            except Exception:
                continue
            if rid in self.reservations:
                continue
            try:
                ok = await self.reserve(addr)
            except Exception as exc:
                ok = False
                log.info("relay_reserve_failed", relay=addr, error=repr(exc))
            if ok and self.reach.public_since is None:
                self.reach.public_since = time.monotonic() - self.started
            if not ok:
                log.info("relay_refused", relay=addr)
        if set(self.circuit_addrs) != before:
            log.info("relay_addrs", addrs=self.circuit_addrs)
            if self.on_change is not None:
                await self.on_change()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # --- dialing through relays ------------------------------------------------------------

    def learn_circuits(self, peer: ID, addrs: Sequence[str]) -> int:
        """Keep a peer's announced /p2p-circuit addresses (only ones ending in its id)."""
        good = [a for a in addrs if is_circuit(a) and a.endswith(f"/p2p/{peer.to_base58()}")]
        good = list(dict.fromkeys(good))[:8]
        if not good:
            return 0
        self.known_circuits[peer] = good
        self.known_circuits.move_to_end(peer)
        while len(self.known_circuits) > self.MAX_KNOWN_CIRCUITS:
            self.known_circuits.popitem(last=False)
        return len(good)

    def circuits_for(self, peer: ID, given: Sequence[str] = ()) -> list[str]:
        """Circuit addresses to try for `peer`: given, announced, then via every relay we
        know (our reservations' relays, configured relays, bootstrap peers)."""
        pid = peer.to_base58()
        out = [a for a in given if is_circuit(a)] + self.known_circuits.get(peer, [])
        relays = [a for a, _ in self.reservations.values()] + self._relay_candidates()
        for r in relays:
            try:
                if info_from_p2p_addr(multiaddr.Multiaddr(r)).peer_id == peer:
                    continue
            except Exception:
                continue
            out.append(f"{r}/p2p-circuit/p2p/{pid}")
        return list(dict.fromkeys(out))[:8]

    async def dial_circuit(self, peer: ID, addrs: Sequence[str]) -> str:
        """Connect to `peer` through the first relay of `addrs` that carries us there;
        returns the circuit address used. Raises P2PError when none does."""
        errors: list[str] = []
        for a in addrs:
            try:
                with trio.fail_after(self.settings.circuit_open_timeout_s):
                    relay_ma, _ = self.transport.parse_circuit_ma(multiaddr.Multiaddr(a))
                    relay = info_from_p2p_addr(relay_ma)
                    self.host.get_peerstore().add_addrs(relay.peer_id, relay.addrs, 3600)
                    raw = await self.transport.dial_peer_info(
                        dest_info=PeerInfo(peer, []), relay_info=relay)
                    await self.host.upgrade_outbound_connection(raw, peer)
                log.info("relayed_connection", peer=peer.to_base58(), via=a)
                return a
            except Exception as exc:
                errors.append(f"{a}: {exc!r}"[:300])
        raise P2PError(f"no relay carried us to {peer.to_base58()}: {errors[-3:]}")


def _conn_relayed(conn: Any) -> bool:
    try:
        addrs = conn.get_transport_addresses()
    except Exception:
        return False
    return any(is_circuit(a) for a in addrs or [])


def connection_kinds(host: IHost) -> dict[str, str]:
    """peer id -> "direct" or "relayed" (direct wins where both exist)."""
    net = host.get_network()
    out: dict[str, str] = {}
    for pid in host.get_connected_peers():
        conns = net.get_connections(pid) if hasattr(net, "get_connections") else []
        kinds = {"relayed" if _conn_relayed(c) else "direct" for c in conns}
        if kinds:
            out[pid.to_base58()] = "direct" if "direct" in kinds else "relayed"
    return out
