"""ChainView: one event-driven snapshot of the polnet contracts per process.

Before this, every daemon re-read every job and dispute it knew of on every tick
(about 1,000 sequential calls per verifier pass at 1,000 jobs). The view instead
pays, per :meth:`ChainView.update`:

- one ``eth_blockNumber``; nothing more while no new block arrived (with a
  WebSocket head subscription, node/chain/heads.py, not even that: one every
  ``check_every`` seconds);
- for a new block, one JSON-RPC batch: the header of the last block seen (its
  hash must not have changed: else the chain reorganised under us and the view is
  rebuilt from the deployment block), the new head's header, and ``eth_getLogs``
  over all our contracts for the new blocks;
- one JSON-RPC batch of ``eth_call``: the jobs, disputes and collaborative jobs the
  new events touched (with a collaborative job's rounds, slot holders and orphan count
  where its events name them, and the OuterJury cases), and every live dispute (its
  clocks move with time), read at the new head so that the snapshot is of one block.

What roles read is a :class:`Snapshot`: frozen, id-keyed, of one block. The first
update (and a rebuild) reads everything since the deployment block, in chunks.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from hexbytes import HexBytes
from web3 import Web3
from web3.datastructures import AttributeDict
from web3.types import LogReceipt

from node.chain.bound import Bound
from node.chain.client import ChainClient
from node.chain.contracts import (
    ChallengePhase,
    CollabJob,
    CollabRound,
    DisputeState,
    Job,
    JuryCase,
    OuterVerdict,
    Phase,
    dispute_state,
    from_struct,
)
from node.chain.events import ChainEvent, Cursor, EventWatcher
from node.chain.heads import HeadSubscription
from node.chain.ids import CaseId, CollabId, DisputeId, JobId
from node.chain.rpc import endpoint_of, rpc_guard
from node.errors import ChainError, ConfigError
from node.fsutil import atomic_write
from node.logs import get_logger

log = get_logger("polnet.chain.view")

ZERO32 = bytes(32)
ZERO_ADDRESS = "0x" + "0" * 40
BATCH_MAX = 200  # eth_calls per JSON-RPC batch: providers cap batch sizes


@dataclass(frozen=True)
class Snapshot:
    """The contracts as of ``block``. ``events`` are those of the blocks this snapshot
    added (all since the deployment block for the first one, or after a rebuild);
    ``epoch`` grows by one at each rebuild (a reorg): a consumer of ``events`` that
    sees it change starts afresh."""

    block: int
    block_hash: bytes
    timestamp: int
    epoch: int
    jobs: Mapping[JobId, Job]
    disputes: Mapping[DisputeId, DisputeState]
    collabs: Mapping[CollabId, CollabJob]
    events: tuple[ChainEvent, ...] = ()
    # CollabMarket rounds by (collab job, round), slot holders and orphan counts by job,
    # OuterJury cases by id: each as of ``block`` (read when an event named it).
    rounds: Mapping[tuple[CollabId, int], CollabRound] = field(default_factory=dict)
    holders: Mapping[CollabId, tuple[str, ...]] = field(default_factory=dict)
    orphans: Mapping[CollabId, int] = field(default_factory=dict)
    cases: Mapping[CaseId, JuryCase] = field(default_factory=dict)

    def live_disputes(self) -> list[DisputeId]:
        return sorted(i for i, d in self.disputes.items() if d.phase != Phase.RESOLVED)

    def round(self, cid: CollabId, r: int) -> CollabRound | None:
        """Round ``r`` of collaborative job ``cid``; None if the job is not in the
        snapshot. Every write to a round emits an event naming it, so a round the view
        never read is one never started: the contract's all-zero view of it."""
        got = self.rounds.get((cid, r))
        if got is not None:
            return got
        job = self.collabs.get(cid)
        if job is None:
            return None
        nobody = cast(Any, ZERO_ADDRESS)
        return CollabRound(0, 0, 0, [JobId(0)] * job.max_workers, 0, False, ZERO32, ZERO32,
                           nobody, 0, 0, False, ChallengePhase.NONE, nobody, CaseId(0),
                           OuterVerdict.NONE)


@dataclass
class _State:
    block: int  # last block taken in
    block_hash: bytes
    timestamp: int = 0
    jobs: dict[JobId, Job] = field(default_factory=dict)
    disputes: dict[DisputeId, DisputeState] = field(default_factory=dict)
    collabs: dict[CollabId, CollabJob] = field(default_factory=dict)
    rounds: dict[tuple[CollabId, int], CollabRound] = field(default_factory=dict)
    holders: dict[CollabId, tuple[str, ...]] = field(default_factory=dict)
    orphans: dict[CollabId, int] = field(default_factory=dict)
    cases: dict[CaseId, JuryCase] = field(default_factory=dict)
    # (lo hash, hi hash) of each dispute's current range: the game does not store them,
    # its DisputeOpened / RangeNarrowed events carry them.
    ranges: dict[DisputeId, tuple[bytes, bytes]] = field(default_factory=dict)


@dataclass
class Touched:
    """What a block range's events may have changed, by id."""

    jobs: set[JobId] = field(default_factory=set)
    disputes: set[DisputeId] = field(default_factory=set)
    collabs: set[CollabId] = field(default_factory=set)
    rounds: set[tuple[CollabId, int]] = field(default_factory=set)
    holders: set[CollabId] = field(default_factory=set)
    orphans: set[CollabId] = field(default_factory=set)
    cases: set[CaseId] = field(default_factory=set)


# CollabMarket events after which a job's slotHolders / orphansOf may differ.
HOLDER_EVENTS = ("CollabPosted", "SlotClaimed", "SlotReleased")
ORPHAN_EVENTS = ("CollabPosted", "RoundsRolledBack", "OrphanSettled")


def touched(events: list[ChainEvent]) -> Touched:
    """The ids the events may have changed. Every CollabMarket write to a round emits
    an event with its jobId and round (a roll-back: firstRound..lastRound), every
    OuterJury write to a case one with its caseId (CollabMarket's OuterChallenged
    names the case it opens)."""
    t = Touched()
    for ev in events:
        a = ev.args
        if ev.contract == "DisputeGame":
            if "id" in a:
                t.disputes.add(DisputeId(int(a["id"])))
            if "jobId" in a:
                t.jobs.add(JobId(int(a["jobId"])))
        elif ev.contract == "CollabMarket":
            if "jobId" in a:
                cid = CollabId(int(a["jobId"]))
                t.collabs.add(cid)
                if "round" in a:
                    t.rounds.add((cid, int(a["round"])))
                if "firstRound" in a:
                    t.rounds.update((cid, q) for q in
                                    range(int(a["firstRound"]), int(a["lastRound"]) + 1))
                if ev.event in HOLDER_EVENTS:
                    t.holders.add(cid)
                if ev.event in ORPHAN_EVENTS:
                    t.orphans.add(cid)
            if "juryCase" in a:
                t.cases.add(CaseId(int(a["juryCase"])))
            if "marketJobId" in a:
                t.jobs.add(JobId(int(a["marketJobId"])))
            t.jobs.update(JobId(int(j)) for j in a.get("subJobs", ()))
        elif ev.contract == "OuterJury":
            if "caseId" in a:
                t.cases.add(CaseId(int(a["caseId"])))
        elif ev.contract in ("JobMarket", "Availability"):
            if "jobId" in a:
                t.jobs.add(JobId(int(a["jobId"])))
            if "disputeId" in a:
                t.disputes.add(DisputeId(int(a["disputeId"])))
    return t


def _as_log(raw: dict[str, Any]) -> LogReceipt:
    """A raw ``eth_getLogs`` entry (hex strings) in the shape web3 decodes."""
    return cast(LogReceipt, AttributeDict({
        "address": Web3.to_checksum_address(raw["address"]),
        "topics": [HexBytes(t) for t in raw["topics"]],
        "data": HexBytes(raw["data"]),
        "blockNumber": int(raw["blockNumber"], 16),
        "blockHash": HexBytes(raw["blockHash"]),
        "transactionHash": HexBytes(raw["transactionHash"]),
        "transactionIndex": int(raw["transactionIndex"], 16),
        "logIndex": int(raw["logIndex"], 16),
    }))


class ChainView:
    """``update()`` (blocking: run it in a worker thread) returns the newest Snapshot.

    ``confirmations`` keeps the view that many blocks behind the head (a real chain);
    ``max_range`` bounds one ``eth_getLogs`` (providers cap it); ``heads``: new heads
    pushed over a WebSocket, so an update without a new block costs no request."""

    def __init__(self, client: ChainClient, *, confirmations: int = 0,
                 max_range: int = 2_000, heads: HeadSubscription | None = None) -> None:
        if client.deployment is None:
            raise ConfigError("the chain view needs a deployment")
        self.client = client
        self.w3 = client.w3
        self.confirmations = confirmations
        self.max_range = max_range
        self._url = endpoint_of(self.w3)
        watched: list[Bound] = [client.market, client.dispute, client.registry]
        for name in ("collab", "outer_jury", "availability"):
            with contextlib.suppress(ConfigError, ChainError):  # an older deployment
                if _deployed(client, name):
                    watched.append(getattr(client, name))
        # The watcher only decodes here: the view keeps its own cursor.
        self._decoder = EventWatcher(self.w3, watched)
        self._addresses = [b.address for b in watched]
        self._has_collab = any(b.name == "CollabMarket" for b in watched)
        self._has_jury = any(b.name == "OuterJury" for b in watched)
        self._lock = threading.Lock()  # one update at a time (held across its RPC)
        self._pub = threading.Lock()  # the snapshot and the log change together (no I/O)
        self._epoch = 0
        self._state: _State | None = None
        self.snapshot: Snapshot | None = None
        # Every event of the current epoch, in chain order: consumers that do not see
        # every snapshot (an EventFeed) read what they missed from here.
        self.log: list[ChainEvent] = []
        self.requests = 0  # HTTP requests this view made (a batch is one)
        self.heads = heads
        self._checked = -float("inf")  # monotonic time of the last HTTP eth_blockNumber

    # --- RPC ------------------------------------------------------------------------

    def _batch(self, reqs: list[tuple[str, list[Any]]]) -> list[Any]:
        self.requests += 1
        with rpc_guard(self._url):
            resps = self.w3.provider.make_batch_request(reqs)  # type: ignore[attr-defined]
        if not isinstance(resps, list):
            raise ChainError(f"batch request failed: {resps.get('error')}")
        out: list[Any] = []
        for (method, _), resp in zip(reqs, resps, strict=True):
            if "error" in resp:
                raise ChainError(f"{method} failed in batch: {resp['error']}")
            out.append(resp["result"])
        return out

    def _head(self) -> int:
        heads, now = self.heads, time.monotonic()
        pushed = heads.head() if heads is not None else None
        if heads is not None and pushed is not None and now - self._checked < heads.check_every:
            return pushed - self.confirmations
        self.requests += 1
        with rpc_guard(self._url):
            n = int(self.w3.eth.block_number)
        self._checked = now
        if heads is not None and pushed is not None and abs(n - pushed) > 1:
            # It went quiet (or the chain shrank under it): HTTP until it is back.
            heads.mark_stale(n - pushed)
        return n - self.confirmations

    def _logs_req(self, lo: int, hi: int) -> tuple[str, list[Any]]:
        return ("eth_getLogs", [{"fromBlock": hex(lo), "toBlock": hex(hi),
                                 "address": self._addresses}])

    def _decode_logs(self, raws: list[dict[str, Any]]) -> list[ChainEvent]:
        out = [e for e in (self._decoder._decode(_as_log(r)) for r in raws)  # noqa: SLF001
               if e is not None]
        out.sort(key=lambda e: (e.block_number, e.log_index))
        return out

    # --- update ---------------------------------------------------------------------

    def update(self) -> Snapshot:
        """Take in the blocks since the last call; the newest snapshot (the same object
        when no block arrived). Raises RpcUnavailable / ChainError, the view unchanged."""
        with self._lock:
            head = self._head()
            st = self._state
            if st is not None and self.snapshot is not None and head <= st.block:
                if head < st.block:  # the chain got shorter: a reorg (or a reverted devnet)
                    return self._rebuild(head)
                return self.snapshot
            if st is None:
                return self._rebuild(head)
            lo = st.block + 1
            hi = min(head, st.block + self.max_range)
            prev, new, raws = self._batch([
                ("eth_getBlockByNumber", [hex(st.block), False]),
                ("eth_getBlockByNumber", [hex(hi), False]),
                self._logs_req(lo, hi)])
            if prev is None or bytes(HexBytes(prev["hash"])) != st.block_hash:
                log.warning("chain_reorg", block=st.block)
                return self._rebuild(head)
            events = self._decode_logs(raws)
            return self._advance(st, hi, new, events, head)

    def _rebuild(self, head: int) -> Snapshot:
        """Read everything from the deployment block (first update, or a reorg)."""
        assert self.client.deployment is not None
        start = self.client.deployment.deploy_block
        if self._state is not None:
            self._epoch += 1
        events: list[ChainEvent] = []
        lo = start
        top = max(head, start)
        while lo <= top:
            hi = min(top, lo + self.max_range - 1)
            (raws,) = self._batch([self._logs_req(lo, hi)])
            events += self._decode_logs(raws)
            lo = hi + 1
        (block,) = self._batch([("eth_getBlockByNumber", [hex(top), False])])
        st = _State(block=start - 1, block_hash=ZERO32)
        self._state = None
        snap = self._advance(st, top, block, events, head, everything=True)
        return snap

    def _advance(self, st: _State, block: int, header: dict[str, Any] | None,
                 events: list[ChainEvent], head: int, everything: bool = False) -> Snapshot:
        if header is None:
            raise ChainError(f"block {block} is not there (the node is behind)")
        t = touched(events)
        for ev in events:  # the range hashes the game does not store
            if ev.contract != "DisputeGame":
                continue
            if ev.event == "DisputeOpened":
                st.ranges[DisputeId(int(ev.args["id"]))] = (bytes(ev.args["startHash"]),
                                                 bytes(ev.args["endHash"]))
            elif ev.event == "RangeNarrowed":
                st.ranges[DisputeId(int(ev.args["id"]))] = (bytes(ev.args["loHash"]),
                                                 bytes(ev.args["hiHash"]))
        t.disputes |= {i for i, d in st.disputes.items() if d.phase != Phase.RESOLVED}
        if not self._has_collab:
            t.collabs, t.rounds, t.holders, t.orphans = set(), set(), set(), set()
        if not self._has_jury:
            t.cases = set()
        self._read(st, block, t)
        st.block = block
        st.block_hash = bytes(HexBytes(header["hash"]))
        st.timestamp = int(header["timestamp"], 16)
        self._state = st
        snap = Snapshot(block=block, block_hash=st.block_hash, timestamp=st.timestamp,
                        epoch=self._epoch, jobs=MappingProxyType(dict(st.jobs)),
                        disputes=MappingProxyType(dict(st.disputes)),
                        collabs=MappingProxyType(dict(st.collabs)), events=tuple(events),
                        rounds=MappingProxyType(dict(st.rounds)),
                        holders=MappingProxyType(dict(st.holders)),
                        orphans=MappingProxyType(dict(st.orphans)),
                        cases=MappingProxyType(dict(st.cases)))
        with self._pub:
            if everything:
                self.log = []
            self.log.extend(events)
            self.snapshot = snap
        if everything or events:
            log.debug("chain_view", block=block, events=len(events), jobs=len(t.jobs),
                      disputes=len(t.disputes), rounds=len(t.rounds), behind=head - block)
        return snap

    def _read(self, st: _State, block: int, t: Touched) -> None:
        """Re-read the touched ids at ``block``, in as few batches as BATCH_MAX allows."""
        c = self.client
        jobs, disputes, collabs = sorted(t.jobs), sorted(t.disputes), sorted(t.collabs)
        rounds, holders = sorted(t.rounds), sorted(t.holders)
        orphans, cases = sorted(t.orphans), sorted(t.cases)
        calls: list[tuple[Bound, str, tuple[Any, ...]]] = \
            [(c.market, "getJob", (j,)) for j in jobs] + \
            [(c.dispute, "getDispute", (d,)) for d in disputes] + \
            [(c.collab, "getCollab", (k,)) for k in collabs] + \
            [(c.collab, "getRound", (k, q)) for k, q in rounds] + \
            [(c.collab, "slotHolders", (k,)) for k in holders] + \
            [(c.collab, "orphansOf", (k,)) for k in orphans] + \
            [(c.outer_jury, "getCase", (k,)) for k in cases]
        if not calls:
            return
        results: list[Any] = []
        for i in range(0, len(calls), BATCH_MAX):
            part = calls[i:i + BATCH_MAX]
            raws = self._batch([("eth_call", [{"to": b.address, "data": b.encode(fn, *args)},
                                              hex(block)]) for b, fn, args in part])
            results += [b.fn(fn).decode(bytes(HexBytes(r)))
                        for (b, fn, _), r in zip(part, raws, strict=True)]
        it = iter(results)
        for j in jobs:
            st.jobs[j] = from_struct(Job, next(it))
        for d in disputes:
            st.disputes[d] = dispute_state(d, next(it), st.ranges.get(d, (ZERO32, ZERO32)))
        for k in collabs:
            st.collabs[k] = from_struct(CollabJob, next(it))
        for key in rounds:
            st.rounds[key] = from_struct(CollabRound, next(it))
        for k in holders:
            st.holders[k] = tuple(str(h) for h in next(it))
        for k in orphans:
            st.orphans[k] = int(next(it))
        for case in cases:
            st.cases[case] = from_struct(JuryCase, next(it))


class EventFeed:
    """One consumer's place in a view's events: :meth:`take` returns each event once,
    in chain order. With ``cursor_path`` the last block handled persists (call
    :meth:`done` after handling), so a restarted process skips what it handled
    before. After a rebuild (a reorg) everything of the new epoch comes again:
    consumers must take replays (they derive their decisions from the chain)."""

    def __init__(self, view: ChainView, cursor_path: Path | None = None) -> None:
        self.view = view
        self.cursor_path = cursor_path
        self._epoch: int | None = None
        self._index = 0
        self._skip_to = -1
        if cursor_path is not None and cursor_path.is_file():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self._skip_to = Cursor.from_json(cursor_path.read_text()).block
        self._block = self._skip_to
        self.restarted = False  # the last take began a new epoch (after a reorg)

    def take(self) -> list[ChainEvent]:
        view = self.view
        with view._pub:  # noqa: SLF001 - brief: never waits on an update's RPC
            snap = view.snapshot
            if snap is None:
                return []
            self.restarted = False
            if snap.epoch != self._epoch:
                if self._epoch is not None:
                    self._skip_to = -1  # a reorg: replay the new epoch's events
                    self.restarted = True
                self._epoch, self._index = snap.epoch, 0
            new = view.log[self._index:]
            self._index = len(view.log)
            self._block = snap.block
        return [e for e in new if e.block_number > self._skip_to]

    def done(self) -> None:
        """Persist: every event taken so far is handled."""
        if self.cursor_path is None or self._block < 0:
            return
        self.cursor_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.cursor_path, Cursor(self._block).to_json().encode(), durable=False)


def _deployed(client: ChainClient, name: str) -> bool:
    assert client.deployment is not None
    contract = {"collab": "CollabMarket", "outer_jury": "OuterJury",
                "availability": "Availability"}[name]
    return contract in client.deployment.contracts
