"""NAT support on loopback, real libp2p hosts: the dial-back reachability check, a
relay reservation, a fetch through the relay and relayed addresses learnt from
gossip. The real-NAT run (network namespaces, nftables) is tests/test_nat.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import trio

from node.errors import PeerUnavailable
from node.p2p import P2PSettings, PolnetNode
from node.p2p.nat import connection_kinds, is_private_only, probe_listener
from node.store.manifest import MiB


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_private_only_addresses() -> None:
    assert is_private_only(["/ip4/10.1.2.3/tcp/4001", "/ip4/192.168.1.2/tcp/1"])
    assert is_private_only(["/ip4/100.64.0.9/tcp/4001"])  # carrier-grade NAT
    assert not is_private_only(["/ip4/127.0.0.1/tcp/4001"])  # loopback: a devnet
    assert not is_private_only(["/ip4/10.1.2.3/tcp/1", "/ip4/198.51.100.2/tcp/1"])
    assert not is_private_only([])


def test_probe_needs_a_libp2p_listener(tmp_path: Path) -> None:
    async def main() -> None:
        with trio.fail_after(30):
            assert not await probe_listener("127.0.0.1", _closed_port(), 2.0)
            async with PolnetNode(tmp_path / "a", P2PSettings()) as a:
                port = int(a.host.get_addrs()[0].value_for_protocol("tcp"))
                assert await probe_listener("127.0.0.1", port, 2.0)

    trio.run(main)


def test_dial_back_finds_loopback_nodes_public(tmp_path: Path) -> None:
    async def main() -> None:
        with trio.fail_after(60):
            async with PolnetNode(tmp_path / "a", P2PSettings()) as a:
                cfg = P2PSettings.model_validate({"bootstrap": [a.addrs[0]]})
                async with PolnetNode(tmp_path / "b", cfg) as b:
                    assert b.nat.relay is None and a.nat.relay is not None  # a: bootstrap
                    for _ in range(100):
                        if b.nat.reach.status != "unknown" and a.nat.reach.status != "unknown":
                            break
                        await trio.sleep(0.2)
                    assert b.nat.reach.status == "public"
                    assert b.nat.reach.confirmed_by == [a.peer_id.to_base58()]
                    assert a.nat.reach.status == "public"
                    assert b.nat.circuit_addrs == []  # public: no relay reserved

    trio.run(main)


def test_fetch_through_a_relay(tmp_path: Path) -> None:
    """A node that reserved a slot on a relay announces its /p2p-circuit address (a
    peer learns it from gossip) and is fetched from through the relay by a stranger
    given only that address."""
    data = os.urandom(3 * MiB + 11)

    async def main() -> None:
        with trio.fail_after(90):
            async with PolnetNode(tmp_path / "relay", P2PSettings()) as relay:
                boot = {"bootstrap": [relay.addrs[0]]}
                # no hole punching here: on loopback it would upgrade the circuit at once
                home = P2PSettings.model_validate(
                    {**boot, "nat": {"relay_client": "on", "hole_punch": False}})
                async with PolnetNode(tmp_path / "home", home) as nated, \
                        PolnetNode(tmp_path / "f", P2PSettings.model_validate(boot)) as fetcher:
                    for _ in range(100):
                        if nated.nat.circuit_addrs \
                                and nated.peer_id in fetcher.nat.known_circuits:
                            break
                        await trio.sleep(0.2)
                    [circuit] = nated.nat.circuit_addrs
                    assert circuit.startswith(relay.addrs[0] + "/p2p-circuit/p2p/")
                    assert nated.addrs[-1] == circuit
                    assert fetcher.nat.known_circuits[nated.peer_id] == [circuit]
                    aid = await nated.publish_bytes(data)
                    # A stranger that knows nothing else (on loopback the others also
                    # meet directly, through the DHT)
                    cfg = P2PSettings.model_validate({"nat": {"hole_punch": False}})
                    async with PolnetNode(tmp_path / "s", cfg) as stranger:
                        assert nated.peer_id not in stranger.host.get_connected_peers()
                        await stranger.fetch(aid, peers=[circuit], provide=False)
                        assert stranger.store.path(aid).read_bytes() == data
                        kinds = connection_kinds(stranger.host)
                        assert kinds[nated.peer_id.to_base58()] == "relayed"
                        assert kinds[relay.peer_id.to_base58()] == "direct"
                    assert relay.nat.relay is not None and relay.nat.relay.relayed_bytes > len(data)

    trio.run(main)


def test_circuit_without_reservation_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        with trio.fail_after(60):
            async with PolnetNode(tmp_path / "relay", P2PSettings()) as relay:
                boot = P2PSettings.model_validate({"bootstrap": [relay.addrs[0]],
                                                   "nat": {"relay_client": "off"}})
                async with PolnetNode(tmp_path / "x", boot) as x, \
                        PolnetNode(tmp_path / "y", boot) as y:
                    circuit = f"{relay.addrs[0]}/p2p-circuit/p2p/{x.peer_id.to_base58()}"
                    with pytest.raises(PeerUnavailable):
                        await y.fetch("ab" * 32, peers=[circuit], provide=False)

    trio.run(main)
