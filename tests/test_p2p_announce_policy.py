"""Announcements accepted only from the entitled party, never replayed, in bounded memory."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio
from libp2p.crypto.keys import PrivateKey
from libp2p.peer.id import ID

from node.p2p import PolnetNode
from node.p2p.announce import Announcement, _signing_bytes, topic_of
from node.p2p.announce_policy import EntitledSenders, ReplayGuard
from node.roles import announce_kinds  # noqa: F401 - registers state_served
from node.roles.runtime import AnnouncementBook, AnnouncementIntake

KIND = "state_served"
TOPIC = topic_of(KIND)


def state(job: int, n: int, aid: str) -> dict[str, Any]:
    return {"job_id": job, "step": n, "state_hash": "0x" + f"{n:064x}", "artifact_id": aid}


def signed(key: PrivateKey, sender: ID, payload: dict[str, Any], seq: int, ts_ms: int) -> bytes:
    fields: dict[str, Any] = {"v": 1, "kind": KIND, "sender": sender.to_base58(), "seq": seq,
                              "ts_ms": ts_ms, "payload": payload}
    fields["sig"] = key.sign(_signing_bytes(fields)).hex()
    return json.dumps(fields, separators=(",", ":")).encode()


def test_foreign_and_replayed_state_served_are_dropped(tmp_path: Path) -> None:
    job, honest_aid, evil_aid = 7, "aa" * 32, "ee" * 32

    async def main() -> None:
        with trio.fail_after(60):
            async with PolnetNode(tmp_path / "hub") as hub, \
                    PolnetNode(tmp_path / "solver") as solver, \
                    PolnetNode(tmp_path / "member") as member, \
                    PolnetNode(tmp_path / "stranger") as stranger:
                sid = solver.peer_id.to_base58()

                async def resolve(job_id: int) -> str | None:
                    return sid if job_id == job else None  # what the chain says

                registered = {sid, member.peer_id.to_base58(), hub.peer_id.to_base58()}
                book = AnnouncementBook()
                intake = AnnouncementIntake(book, EntitledSenders(resolve, lambda: registered),
                                            hub.verifier.dropped)
                rx = await hub.subscribe(KIND)
                for n in (solver, member, stranger):
                    await n.connect(hub.addrs[0])
                    await n.wait_for_topic_peers(KIND, 1)
                await trio.sleep(1.5)  # one heartbeat: meshes form

                # The solver's own, then a registered node and a stranger claiming the
                # same state with their artifact: last-one-wins would take theirs.
                await solver.announce(KIND, state(job, 1, honest_aid))
                await trio.sleep(0.2)
                await member.announce(KIND, state(job, 1, evil_aid))
                await stranger.announce(KIND, state(job, 1, evil_aid))
                await member.announce(KIND, state(job + 1, 2, evil_aid))  # a job with no solver
                # The solver's own message again (same seq and timestamp): a replay.
                now = int(time.time() * 1000)
                raw = signed(solver.key_pair.private_key, solver.peer_id,
                             state(job, 3, honest_aid), 900, now)
                await solver.pubsub.publish(TOPIC, raw)
                await trio.sleep(0.15)
                await solver.pubsub.publish(TOPIC, raw)
                await trio.sleep(0.15)
                # Signed by the solver, but an hour old: not even forwarded.
                old = signed(solver.key_pair.private_key, solver.peer_id,
                             state(job, 4, honest_aid), 901, now - 3600_000)
                await solver.pubsub.publish(TOPIC, old)

                outcomes: Counter[bool] = Counter()
                with trio.move_on_after(5):
                    while sum(outcomes.values()) < 5:  # the replay stops in the pump
                        outcomes[await intake.take(await rx.receive())] += 1
                await trio.sleep(0.5)
                while True:  # anything else that arrived
                    try:
                        outcomes[await intake.take(rx.receive_nowait())] += 1
                    except trio.WouldBlock:
                        break
                d = hub.verifier.dropped
                assert outcomes[True] == 2  # the solver's two distinct states
                assert book.states[(job, "0x" + f"{1:064x}")] == honest_aid
                assert book.states[(job, "0x" + f"{3:064x}")] == honest_aid
                assert all(aid == honest_aid for aid in book.states.values())
                assert d["not_entitled"] == 1 and d["not_registered"] == 1
                assert d["unknown_job"] == 1
                assert d["replayed"] == 1 and d["stale"] >= 1

    trio.run(main)


def _ann(sender: str, seq: int, payload: dict[str, Any], ts_ms: int) -> Announcement:
    return Announcement.model_construct(v=1, kind=KIND, sender=sender, seq=seq, ts_ms=ts_ms,
                                        payload=payload, sig="00")


def test_100k_strangers_leave_memory_bounded() -> None:
    """Counts, not timings: every table stays under its cap whatever strangers send."""
    solver = "12D3KooWSolver"
    lookups = 0

    async def resolve(job_id: int) -> str | None:
        nonlocal lookups
        lookups += 1
        return solver

    async def main() -> None:
        now = int(time.time() * 1000)
        registered = {solver, "12D3KooWMember"}
        book = AnnouncementBook()
        dropped: Counter[str] = Counter()
        entitled = EntitledSenders(resolve, lambda: registered, max_jobs=1024)
        intake = AnnouncementIntake(book, entitled, dropped)
        guard = ReplayGuard(max_senders=4096, per_sender=512)
        n = 100_000
        for i in range(n):  # 100k strangers, each with a fresh identity
            ann = _ann(f"12D3KooWStranger{i}", i, state(i, i, f"{i:064x}"), now)
            assert guard.check(ann, now) == ""
            assert not await intake.take(ann)
        assert dropped["not_registered"] == n and lookups == 0 and len(book) == 0
        assert guard.senders == 4096 and len(guard) == 4096
        for i in range(n):  # one registered node, 100k jobs it does not solve
            ann = _ann("12D3KooWMember", i, state(i, i, f"{i:064x}"), now)
            guard.check(ann, now)
            assert not await intake.take(ann)
        assert dropped["not_entitled"] == n and len(entitled._cache) <= 1024
        assert len(guard._seen["12D3KooWMember"]) == 512
        for i in range(n):  # the solver itself, 100k states: the book keeps the newest
            assert await intake.take(_ann(solver, i, state(i % 50, i, f"{i:064x}"), now))
        assert len(book.states) == AnnouncementBook.MAX_STATES
        assert book.states[((n - 1) % 50, "0x" + f"{n - 1:064x}")] == f"{n - 1:064x}"
        assert len(book._jobs_of) <= AnnouncementBook.MAX_STATES + AnnouncementBook.MAX_JOBS

    trio.run(main)


def test_replay_guard_window() -> None:
    g = ReplayGuard(window_s=60, skew_s=5)
    now = 1_000_000_000
    a = _ann("p", 1, {}, now)
    assert g.check(a, now) == "" and g.check(a, now) == "replayed"
    assert g.check(_ann("p", 2, {}, now), now) == ""
    assert g.check(_ann("p", 3, {}, now - 61_000), now) == "stale"
    assert g.check(_ann("p", 4, {}, now + 6_000), now) == "future"


def _outer(sender: str, seq: int, cid: int, r: int, aid: str, now: int) -> Announcement:
    payload = {"collab_job_id": cid, "round": r, "outer_hash": "0x" + "ab" * 32,
               "artifact_id": aid}
    return Announcement.model_construct(v=1, kind="outer_state", sender=sender, seq=seq,
                                        ts_ms=now, payload=payload, sig="00")


def test_outer_state_hints_come_from_registered_nodes_one_each() -> None:
    """The attack: a peer floods `outer_state` announcements for a round with junk
    artifacts, so a joiner's few hints are all its own (each a slow or wrong download
    before it falls back to recomputing). Strangers are dropped before the book; a
    registered flooder keeps one entry however much it sends; the honest announcers'
    hints stay, the latest first, up to MAX_OUTER_SENDERS senders."""
    async def resolve(job_id: int) -> str | None:
        raise AssertionError("outer_state needs no chain lookup")

    async def main() -> None:
        now = int(time.time() * 1000)
        honest = [f"12D3KooWHonest{i}" for i in range(3)]
        flooder = "12D3KooWFlooder"
        book = AnnouncementBook()
        dropped: Counter[str] = Counter()
        late = [f"12D3KooWLate{i}" for i in range(50)]
        intake = AnnouncementIntake(
            book, EntitledSenders(resolve, lambda: {*honest, flooder, *late}), dropped)
        for i in range(1000):  # strangers: dropped, nothing kept
            assert not await intake.take(_outer(f"12D3KooWStranger{i}", i, 1, 2, f"{i:064x}",
                                                now))
        assert dropped["not_registered"] == 1000 and not book.outer
        for i, h in enumerate(honest):
            assert await intake.take(_outer(h, 0, 1, 2, f"{i + 1:064x}", now))
        for i in range(10_000):  # a registered flooder: one entry, its latest artifact
            assert await intake.take(_outer(flooder, i, 1, 2, f"{i + 100:064x}", now))
        hints = book.outer_hints(1, 2)
        assert hints[0] == (flooder, f"{10_099:064x}")
        assert [s for s, _ in hints[1:]] == honest[::-1]
        for i, s in enumerate(late):  # more senders than the cap: the oldest leave first
            assert await intake.take(_outer(s, 0, 1, 2, f"{i + 200:064x}", now))
        assert [s for s, _ in book.outer_hints(1, 2)] == \
            late[::-1][:AnnouncementBook.MAX_OUTER_SENDERS]
        assert book.outer_hints(9, 9) == []

    trio.run(main)
