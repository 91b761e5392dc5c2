"""ChainView: one event-driven snapshot of the polnet contracts per process.

Before this, every daemon re-read every job and dispute it knew of on every tick
(about 1,000 sequential calls per verifier pass at 1,000 jobs). The view instead
pays, per :meth:`ChainView.update`:

- one ``eth_blockNumber``; nothing more while no new block arrived;
- for a new block, one JSON-RPC batch: the header of the last block seen (its
  hash must not have changed: else the chain reorganised under us and the view is
  rebuilt from the deployment block), the new head's header, and ``eth_getLogs``
  over all our contracts for the new blocks;
- one JSON-RPC batch of ``eth_call``: the jobs, disputes and collaborative jobs the
  new events touched, and every live dispute (its clocks move with time), read at
  the new head so that the snapshot is of one block.

What roles read is a :class:`Snapshot`: frozen, id-keyed, of one block. The first
update (and a rebuild) reads everything since the deployment block, in chunks.
"""

from __future__ import annotations

import contextlib
import os
import threading
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
    CollabJob,
    DisputeState,
    Job,
    Phase,
    dispute_state,
    from_struct,
)
from node.chain.events import ChainEvent, Cursor, EventWatcher
from node.chain.rpc import endpoint_of, rpc_guard
from node.errors import ChainError, ConfigError
from node.logs import get_logger

log = get_logger("polnet.chain.view")

ZERO32 = bytes(32)
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
    jobs: Mapping[int, Job]
    disputes: Mapping[int, DisputeState]
    collabs: Mapping[int, CollabJob]
    events: tuple[ChainEvent, ...] = ()

    def live_disputes(self) -> list[int]:
        return sorted(i for i, d in self.disputes.items() if d.phase != Phase.RESOLVED)


@dataclass
class _State:
    block: int  # last block taken in
    block_hash: bytes
    timestamp: int = 0
    jobs: dict[int, Job] = field(default_factory=dict)
    disputes: dict[int, DisputeState] = field(default_factory=dict)
    collabs: dict[int, CollabJob] = field(default_factory=dict)
    # (lo hash, hi hash) of each dispute's current range: the game does not store them,
    # its DisputeOpened / RangeNarrowed events carry them.
    ranges: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)


def touched(events: list[ChainEvent]) -> tuple[set[int], set[int], set[int]]:
    """Job, dispute and collaborative-job ids the events may have changed."""
    jobs: set[int] = set()
    disputes: set[int] = set()
    collabs: set[int] = set()
    for ev in events:
        a = ev.args
        if ev.contract == "DisputeGame":
            if "id" in a:
                disputes.add(int(a["id"]))
            if "jobId" in a:
                jobs.add(int(a["jobId"]))
        elif ev.contract == "CollabMarket":
            if "jobId" in a:
                collabs.add(int(a["jobId"]))
            if "marketJobId" in a:
                jobs.add(int(a["marketJobId"]))
            jobs.update(int(j) for j in a.get("subJobs", ()))
        elif ev.contract in ("JobMarket", "Availability"):
            if "jobId" in a:
                jobs.add(int(a["jobId"]))
            if "disputeId" in a:
                disputes.add(int(a["disputeId"]))
    return jobs, disputes, collabs


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
    ``max_range`` bounds one ``eth_getLogs`` (providers cap it)."""

    def __init__(self, client: ChainClient, *, confirmations: int = 0,
                 max_range: int = 2_000) -> None:
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
        self._lock = threading.Lock()  # one update at a time (held across its RPC)
        self._pub = threading.Lock()  # the snapshot and the log change together (no I/O)
        self._epoch = 0
        self._state: _State | None = None
        self.snapshot: Snapshot | None = None
        # Every event of the current epoch, in chain order: consumers that do not see
        # every snapshot (an EventFeed) read what they missed from here.
        self.log: list[ChainEvent] = []
        self.requests = 0  # HTTP requests this view made (a batch is one)

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
        self.requests += 1
        with rpc_guard(self._url):
            return int(self.w3.eth.block_number) - self.confirmations

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
        jobs, disputes, collabs = touched(events)
        for ev in events:  # the range hashes the game does not store
            if ev.contract != "DisputeGame":
                continue
            if ev.event == "DisputeOpened":
                st.ranges[int(ev.args["id"])] = (bytes(ev.args["startHash"]),
                                                 bytes(ev.args["endHash"]))
            elif ev.event == "RangeNarrowed":
                st.ranges[int(ev.args["id"])] = (bytes(ev.args["loHash"]),
                                                 bytes(ev.args["hiHash"]))
        disputes |= {i for i, d in st.disputes.items() if d.phase != Phase.RESOLVED}
        if not self._has_collab:
            collabs = set()
        self._read(st, block, sorted(jobs), sorted(disputes), sorted(collabs))
        st.block = block
        st.block_hash = bytes(HexBytes(header["hash"]))
        st.timestamp = int(header["timestamp"], 16)
        self._state = st
        snap = Snapshot(block=block, block_hash=st.block_hash, timestamp=st.timestamp,
                        epoch=self._epoch, jobs=MappingProxyType(dict(st.jobs)),
                        disputes=MappingProxyType(dict(st.disputes)),
                        collabs=MappingProxyType(dict(st.collabs)), events=tuple(events))
        with self._pub:
            if everything:
                self.log = []
            self.log.extend(events)
            self.snapshot = snap
        if everything or events:
            log.debug("chain_view", block=block, events=len(events), jobs=len(jobs),
                      disputes=len(disputes), behind=head - block)
        return snap

    def _read(self, st: _State, block: int, jobs: list[int], disputes: list[int],
              collabs: list[int]) -> None:
        """Re-read the given ids at ``block``, in as few batches as BATCH_MAX allows."""
        c = self.client
        calls: list[tuple[Bound, str, tuple[Any, ...]]] = \
            [(c.market, "getJob", (j,)) for j in jobs] + \
            [(c.dispute, "getDispute", (d,)) for d in disputes] + \
            [(c.collab, "getCollab", (k,)) for k in collabs]
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
        tmp = self.cursor_path.with_suffix(".tmp")
        tmp.write_text(Cursor(self._block).to_json())
        os.replace(tmp, self.cursor_path)


def _deployed(client: ChainClient, name: str) -> bool:
    assert client.deployment is not None
    contract = {"collab": "CollabMarket", "outer_jury": "OuterJury",
                "availability": "Availability"}[name]
    return contract in client.deployment.contracts
