"""Real libp2p hosts on 127.0.0.1: discovery, DHT provider lookup, corrupt peers, gossip."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from node.errors import PeerUnavailable
from node.p2p import P2PSettings, PolnetNode
from node.p2p.announce import MAX_ANNOUNCE_BYTES, make_announcement
from node.p2p.limits import TokenBucket
from node.store.manifest import MiB


@asynccontextmanager
async def nodes(tmp: Path, n: int, bootstrap_first: bool = True,
                **kw: object) -> AsyncIterator[list[PolnetNode]]:
    async with AsyncExitStack() as stack:
        first = PolnetNode(tmp / "n0", P2PSettings.model_validate(kw))
        out = [await stack.enter_async_context(first)]
        boot = [out[0].addrs[0]] if bootstrap_first else []
        for i in range(1, n):
            cfg = P2PSettings.model_validate({**kw, "bootstrap": boot})
            out.append(await stack.enter_async_context(PolnetNode(tmp / f"n{i}", cfg)))
        yield out


def test_discovery_and_dht_fetch(tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 7)

    async def main() -> None:
        with trio.fail_after(60):
            async with nodes(tmp_path, 4) as ns:
                for node in ns[1:]:
                    await node.discover()
                for node in ns:  # everyone found everyone through the one bootstrap address
                    others = {p.peer_id for p in ns if p is not node}
                    assert others <= set(node.host.get_connected_peers()), node.peer_id
                aid = await ns[1].publish_bytes(data)
                provs = await ns[3].find_providers(aid)
                assert [p.peer_id for p in provs] == [ns[1].peer_id]
                await ns[3].fetch(aid)  # providers from the DHT
                assert ns[3].store.path(aid).read_bytes() == data
                # ns[3] now provides too; lookups return each provider once
                provs = await ns[2].find_providers(aid)
                ids = [p.peer_id for p in provs]
                assert ids and len(ids) == len(set(ids))
                assert set(ids) <= {ns[1].peer_id, ns[3].peer_id}

    trio.run(main)


def test_corrupt_provider_is_dropped(tmp_path: Path) -> None:
    data = os.urandom(4 * MiB)

    async def main() -> None:
        with trio.fail_after(60):
            async with nodes(tmp_path, 4, bootstrap_first=False) as (good, bad, fetcher, victim):
                aid = good.store.put_bytes(data)
                assert bad.store.put_bytes(data) == aid
                with open(bad.store.path(aid), "r+b") as fh:  # bit rot in every chunk
                    for off in (5, MiB + 5, 2 * MiB + 7, 3 * MiB + 9):
                        fh.seek(off)
                        fh.write(b"\xff\x00")
                stats = await fetcher.fetch(aid, peers=[good.addrs[0], bad.addrs[0]])
                assert fetcher.store.path(aid).read_bytes() == data
                assert bad.peer_id.to_base58() in stats.bad_peers
                assert bad.peer_id in fetcher.banned
                # Only the corrupt peer: nothing corrupt lands, verified chunks are kept.
                with pytest.raises(PeerUnavailable):
                    await victim.fetch(aid, peers=[bad.addrs[0]])
                assert not victim.store.has(aid)
                part = victim.store.begin_download(good.store.manifest(aid))
                assert part.missing() == [0, 1, 2, 3]
                part.close()

    trio.run(main)


def test_gossip_signed_announcements(tmp_path: Path) -> None:
    kind, aid = "artifact_available", "ab" * 32

    async def main() -> None:
        with trio.fail_after(60):
            async with nodes(tmp_path, 3) as (hub, sender, evil):
                rx = await hub.subscribe(kind)
                await sender.connect(hub.addrs[0])
                await evil.connect(hub.addrs[0])
                await sender.wait_for_topic_peers(kind, 1)
                await evil.wait_for_topic_peers(kind, 1)
                await trio.sleep(1.5)  # one heartbeat: meshes form
                topic = "polnet/artifacts/1"
                good = make_announcement(evil.key_pair.private_key, evil.peer_id, kind,
                                         {"artifact_ids": [aid]}, 1)
                fields = json.loads(good)
                unsigned = {k: v for k, v in fields.items() if k != "sig"}
                tampered = {**fields, "payload": {"artifact_ids": ["cd" * 32]}}
                extra = {**fields, "payload": {"artifact_ids": [aid], "evil": 1}}
                claims_other = json.loads(make_announcement(
                    evil.key_pair.private_key, sender.peer_id, kind, {"artifact_ids": [aid]}, 2))
                big = {**fields, "payload": {"artifact_ids": [aid],
                                             "note": "x" * MAX_ANNOUNCE_BYTES}}
                for bad in (b"\x00not json", unsigned, tampered, extra, claims_other, big):
                    raw = bad if isinstance(bad, bytes) else json.dumps(bad).encode()
                    await evil.pubsub.publish(topic, raw)
                    await trio.sleep(0.15)  # stay under gossipsub's silent ~10/s limit
                await sender.announce(kind, {"artifact_ids": [aid], "job_id": 7})
                ann = await rx.receive()
                assert ann.sender == sender.peer_id.to_base58()
                assert ann.payload == {"artifact_ids": [aid], "job_id": 7}
                await trio.sleep(0.5)
                with pytest.raises(trio.WouldBlock):
                    rx.receive_nowait()
                dropped = hub.verifier.dropped
                assert dropped["malformed"] == 1 and dropped["unsigned"] == 1
                assert dropped["bad_signature"] == 1 and dropped["bad_payload"] == 1
                assert dropped["sender_mismatch"] == 1 and dropped["oversized"] == 1

    trio.run(main)


def test_a_forwarder_relaying_several_publishers_is_not_cut_off(tmp_path: Path) -> None:
    """gossipsub's receive limit (10 msgs/s per forwarding peer and topic) counted what a
    mesh neighbour *relayed*: two publishers each paced at 5/s through one neighbour went
    over it, the rest were dropped with "Rate limit exceeded" (261 such lines in one
    `job fetch`) and the neighbour penalised. 20/s through one peer now all arrive."""
    kind = "artifact_available"

    async def main() -> None:
        with trio.fail_after(60):
            async with nodes(tmp_path, 2) as (hub, relay):
                rx = await hub.subscribe(kind)
                await relay.wait_for_topic_peers(kind, 1)
                await trio.sleep(1.5)  # one heartbeat: meshes form
                for i in range(30):  # as two publishers at 10/s each would arrive
                    raw = make_announcement(relay.key_pair.private_key, relay.peer_id, kind,
                                            {"artifact_ids": [f"{i:064x}"]}, i + 1)
                    await relay.pubsub.publish("polnet/artifacts/1", raw)
                    await trio.sleep(0.05)
                got: set[str] = set()
                with trio.move_on_after(10):
                    while len(got) < 30:
                        got.add((await rx.receive()).payload["artifact_ids"][0])
                assert len(got) == 30

    trio.run(main)


def test_token_bucket_paces_without_dropping() -> None:
    async def main() -> None:
        bucket = TokenBucket(rate=5, burst=5)
        start = trio.current_time()
        for _ in range(15):
            await bucket.take()
        assert 1.9 < trio.current_time() - start < 2.2  # 5 at once, then 5/s

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_identity_persists_with_0600(tmp_path: Path) -> None:
    from node.p2p.identity import load_or_create_keypair, peer_id_of

    key = tmp_path / "k" / "p2p.key"
    a = peer_id_of(load_or_create_keypair(key))
    assert key.stat().st_mode & 0o777 == 0o600
    assert peer_id_of(load_or_create_keypair(key)) == a
    assert hashlib.sha256(key.read_bytes()).hexdigest()  # non-empty, stable file


def test_per_peer_stream_limit(tmp_path: Path) -> None:
    """A peer opening more streams than allowed is refused (RateLimited), not served."""
    from node.errors import RateLimited
    from node.p2p.limits import ServeLimits
    from node.p2p.transfer import ArtifactClient

    data = os.urandom(2 * MiB)

    async def main() -> None:
        with trio.fail_after(60):
            async with nodes(tmp_path, 2, bootstrap_first=False,
                             serve=ServeLimits(max_streams_per_stranger=1),
                             streams_per_peer=3) as (server, client):
                aid = server.store.put_bytes(data)
                await client.connect(server.addrs[0])
                first = await ArtifactClient.open(client.host, server.peer_id)
                await first.manifest(aid)  # holds the one allowed stream
                second = await ArtifactClient.open(client.host, server.peer_id)
                with pytest.raises(RateLimited):
                    await second.manifest(aid)
                await first.close()
                await trio.sleep(0.2)
                stats = await client.fetch(aid, peers=[server.addrs[0]])  # 3 streams, 1 served
                assert client.store.path(aid).read_bytes() == data
                assert sum(stats.chunks_fetched.values()) == 2

    trio.run(main)


def test_only_libp2p_shutdown_races_are_ignored_at_close() -> None:
    """py-libp2p may schedule a pubsub read on a stopping service while a node closes
    (seen as `job fetch` / `job submit` crashing after their work was done)."""
    from node.p2p.host import _without_shutdown_races

    race = RuntimeError("Nursery is closed to new arrivals")
    assert _without_shutdown_races(race) is None
    assert _without_shutdown_races(BaseExceptionGroup("x", [race, race])) is None
    real = ValueError("a real failure")
    rest = _without_shutdown_races(BaseExceptionGroup("x", [race, real]))
    assert isinstance(rest, BaseExceptionGroup) and rest.exceptions == (real,)
    assert _without_shutdown_races(real) is real
    other = RuntimeError("something else")
    assert _without_shutdown_races(other) is other
