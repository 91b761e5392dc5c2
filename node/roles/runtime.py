"""What every long-running role shares: settings, the chain client, the artifact
store, the libp2p node, announcements heard, metrics.

One trio loop per process: the p2p node runs on it; web3 calls and torch work
go to worker threads through :meth:`Runtime.chain` and ``trio.to_thread``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from node.chain.client import ChainClient
from node.chain.contracts import JobStatus
from node.chain.deployment import Deployment
from node.chain.heads import HeadSubscription
from node.chain.ids import JobId
from node.chain.revert_names import errors
from node.chain.rpc import backoff_delay, node_failure
from node.chain.view import ChainView, EventFeed, Snapshot
from node.config import NodeSettings
from node.errors import ChainError, ConfigError, ContractRevert, PeerUnavailable, RpcUnavailable
from node.fsutil import atomic_write
from node.logs import get_logger
from node.p2p import PolnetNode
from node.p2p.announce import Announcement
from node.p2p.announce_policy import EntitledSenders
from node.p2p.nat import STATUS_VALUE, connection_kinds
from node.roles import announce_kinds  # noqa: F401 - registers the dispute kinds
from node.roles.metrics import Metrics
from node.roles.registry_view import RegistryView
from node.units import wei_to_pol

SOLVER, VERIFIER = 1, 2
T = TypeVar("T")
log = get_logger("polnet.runtime")

WITHDRAW_BENIGN = errors("NothingToWithdraw")
RPC_PATIENCE_S = 120.0  # how long a node waits out a dead RPC before giving up
STARTUP_ATTEMPTS = 8  # tries of each start-up step that meets a node error
GC_EVERY_S = 300.0       # how often a daemon collects garbage in its store
PART_MAX_AGE_S = 2 * 3600.0  # an interrupted download untouched this long is deleted


class AnnouncementBook:
    """What job solvers announced, by job. Only hints: every artifact fetched is
    checked against hashes on chain before use. Only announcements that passed
    the entitlement policy (the job's own solver) get here, so the latest one of
    the entitled party wins; every table is bounded (least recently used first out).
    """

    MAX_JOBS = 1024
    MAX_MANIFESTS_PER_JOB = 4
    MAX_STATES = 8192
    MAX_OUTER_SENDERS = 8  # per (collaborative job, round): one artifact each

    def __init__(self) -> None:
        self.manifests: OrderedDict[int, list[str]] = OrderedDict()
        self.states: OrderedDict[tuple[int, str], str] = OrderedDict()
        self.specs: dict[str, list[str]] = {}  # spec artifact id -> announcer peers
        # (collaborative job, round) -> {sender: outer-state artifact}, the latest sender
        # last: unchecked hints, each checked against the CollabMarket's accepted hash
        # once fetched. One entry per sender, so a flooding peer cannot push the others'
        # out; announcers are registered nodes (announce_policy.REGISTERED_KINDS).
        self.outer: OrderedDict[tuple[int, int], OrderedDict[str, str]] = OrderedDict()
        self._jobs_of: OrderedDict[str, int] = OrderedDict()  # artifact id -> job

    def add(self, ann: Announcement) -> None:
        p = ann.payload
        if ann.kind == "result_committed" and p.get("artifact_ids"):
            jid, aid = int(p["job_id"]), str(p["artifact_ids"][0])
            ids = self.manifests.setdefault(jid, [])
            self.manifests.move_to_end(jid)
            if aid in ids:  # the newest first, re-announcements refresh
                ids.remove(aid)
            ids.insert(0, aid)
            del ids[self.MAX_MANIFESTS_PER_JOB:]
            while len(self.manifests) > self.MAX_JOBS:
                self.manifests.popitem(last=False)
            self._note(aid, jid)
        elif ann.kind == "outer_state":
            key2 = (int(p["collab_job_id"]), int(p["round"]))
            by_sender = self.outer.setdefault(key2, OrderedDict())
            self.outer.move_to_end(key2)
            by_sender[ann.sender] = str(p["artifact_id"])
            by_sender.move_to_end(ann.sender)
            while len(by_sender) > self.MAX_OUTER_SENDERS:
                by_sender.popitem(last=False)
            while len(self.outer) > self.MAX_JOBS:
                self.outer.popitem(last=False)
        elif ann.kind == "state_served":
            jid, aid = int(p["job_id"]), str(p["artifact_id"])
            key = (jid, str(p["state_hash"]).lower())
            self.states[key] = aid
            self.states.move_to_end(key)
            while len(self.states) > self.MAX_STATES:
                self.states.popitem(last=False)
            self._note(aid, jid)

    def _note(self, aid: str, jid: int) -> None:
        self._jobs_of[aid] = jid
        self._jobs_of.move_to_end(aid)
        while len(self._jobs_of) > self.MAX_STATES + self.MAX_JOBS:
            self._jobs_of.popitem(last=False)

    def outer_hints(self, cid: int, r: int) -> list[tuple[str, str]]:
        """(sender, artifact) announced for job ``cid``'s theta_r, the latest first."""
        return list(reversed(self.outer.get((cid, r), {}).items()))

    def job_of(self, artifact_id: str) -> int | None:
        """The job an announced artifact belongs to, if the book knows."""
        return self._jobs_of.get(artifact_id)

    def __len__(self) -> int:
        return len(self.states) + sum(len(v) for v in self.manifests.values())


class AnnouncementIntake:
    """Feeds the book with what the entitled party announced; counts the rest."""

    def __init__(self, book: AnnouncementBook, entitled: EntitledSenders,
                 dropped: Counter[str]) -> None:
        self.book = book
        self.entitled = entitled
        self.dropped = dropped

    async def take(self, ann: Announcement) -> bool:
        reason = await self.entitled.check(ann)
        if reason:
            self.dropped[reason] += 1
            return False
        self.book.add(ann)
        return True


class Runtime:
    """Enter with ``async with Runtime(settings, role="solver") as rt``."""

    def __init__(self, settings: NodeSettings, role: str) -> None:
        self.settings = settings
        self.role = role
        self.dir = settings.node_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.book = AnnouncementBook()
        self.registered_peers: set[str] = set()
        # peer id -> the account that registered it (any registration, latest or not):
        # a ban charged to a peer reaches its account (node.roles.bans)
        self.peer_accounts: dict[str, str] = {}
        self.metrics = Metrics.create()
        self._settled: set[int] = set()
        self._chain: ChainClient | None = None
        self._p2p: PolnetNode | None = None
        self.metrics_port: int | None = None
        self._view: ChainView | None = None
        self._heads: HeadSubscription | None = None
        self._view_lock = trio.Lock()
        self._view_at = -math.inf
        # trio time the current snapshot's update began: the snapshot shows every
        # transaction whose receipt came back before it
        self.snapshot_started = -math.inf

    @property
    def chain_client(self) -> ChainClient:
        assert self._chain is not None, "runtime not entered"
        return self._chain

    @property
    def view(self) -> ChainView:
        """The process's one chain view (node/chain/view.py): every role reads it."""
        if self._view is None:
            # At the head: roles act on it, and a view some blocks behind would have
            # them redo what they just did. A reorg rebuilds it (a new epoch).
            ws = self.settings.rpc.ws_url
            self._heads = HeadSubscription(ws, self.settings.rpc).start() if ws else None
            self._view = ChainView(self.chain_client, heads=self._heads)
        return self._view

    async def snapshot(self, fresh: bool = False) -> Snapshot:
        """The newest chain snapshot. Roles may ask every tick: the view is updated at
        most once per ``poll_interval`` whoever asks (one eth_blockNumber while no
        block arrives), so the process's RPC cost does not grow with its roles.
        ``fresh``: updated now, whenever it last was."""
        async with self._view_lock:
            view = self.view
            if fresh or view.snapshot is None or \
                    trio.current_time() - self._view_at >= 0.9 * self.settings.poll_interval:
                started = trio.current_time()
                await self.chain(view.update)
                self._view_at, self.snapshot_started = trio.current_time(), started
            assert view.snapshot is not None
            return view.snapshot

    @property
    def p2p(self) -> PolnetNode:
        assert self._p2p is not None, "runtime not entered"
        return self._p2p

    @property
    def address(self) -> str:
        addr = self.chain_client.address
        assert addr is not None
        return str(addr)

    async def __aenter__(self) -> Runtime:
        key = self.settings.load_private_key()
        dep = Deployment.load(self.settings.deployment_path)
        self._chain = await self.start_step("connect", lambda: self.chain(
            ChainClient, self.settings.rpc_url or dep.rpc_url, key, dep, rpc=self.settings.rpc,
            expected_chain_id=self.settings.expected_chain_id))
        self._p2p = PolnetNode(self.settings.p2p_dir, self.settings.p2p)
        await self._p2p.__aenter__()
        assert self._p2p.nursery is not None
        self.intake = AnnouncementIntake(
            self.book, EntitledSenders(self._solver_peer_of, lambda: self.registered_peers),
            self._p2p.verifier.dropped)
        for kind in ("result_committed", "state_served", "outer_state"):
            chan = await self._p2p.subscribe(kind)
            self._p2p.nursery.start_soon(self._pump, chan)
        self._p2p.nursery.start_soon(self._registry_peers_loop)
        self._p2p.nursery.start_soon(self._gc_loop)
        self._p2p.nursery.start_soon(self._nat_loop)
        if self.settings.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.settings.metrics_port)
        self._write_info()
        log.info("node_up", role=self.role, name=self.settings.name, address=self.address,
                 peer_id=self._p2p.peer_id.to_base58(), addrs=self._p2p.addrs,
                 metrics_port=self.metrics_port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._heads is not None:
            self._heads.close()
        if self._p2p is not None:
            await self._p2p.__aexit__(*exc)

    def _write_info(self) -> None:
        """node.json: how other local processes (the demo, tests) reach this node."""
        info = {"role": self.role, "address": self.address, "pid": os.getpid(),
                "peer_id": self.p2p.peer_id.to_base58(), "addrs": self.p2p.addrs,
                "metrics_port": self.metrics_port, "reachability": self.p2p.nat.status(),
                "connections": connection_kinds(self.p2p.host)}
        atomic_write(self.dir / "node.json", json.dumps(info, indent=2).encode(),
                     durable=False)

    async def _registry_peers_loop(self) -> None:
        """Discovery from the chain: dial what the registry lists, now and then again,
        so a restarted node (new port) and its peers find each other without luck.
        Only nodes with slashable stake get reserved serving slots and may announce;
        the parties and jurors of live disputes are served first."""
        known: set[tuple[str, tuple[str, ...]]] = set()
        view = RegistryView(self.chain_client, feed=EventFeed(self.view))
        me = self.p2p.peer_id.to_base58()
        while True:
            try:
                await self.snapshot()  # the events come from the process's chain view
                await self.chain(view.refresh)
                peers = view.peers(exclude=self.address)
                self.registered_peers = view.staked() | {me}
                # who announced: a ban on a bad sender holds its account too (collab);
                # updated, not replaced, so a node's earlier peer ids keep its account
                self.peer_accounts.update(view.accounts())
                self.p2p.set_staked(self.registered_peers)
                self.p2p.set_seats(view.seats())
                fresh = [(p, a) for p, a in peers if (p, tuple(a)) not in known]
                if fresh:
                    n = await self.p2p.add_registry_peers(fresh)
                    known.update((p, tuple(a)) for p, a in fresh)
                    log.info("registry_peers", new=len(fresh), reachable=n,
                             staked=len(self.registered_peers) - 1)
            except Exception as exc:  # discovery is retried; never fatal
                log.warning("registry_peers_failed", error=repr(exc))
            await trio.sleep(5.0)

    async def _nat_loop(self) -> None:
        """Reachability and relays into /metrics and node.json (read by `polnet node
        status`), every few seconds."""
        last: Any = None
        for _ in range(10**9):  # bounded by the node's life: each pass sleeps
            await trio.sleep(2.0)
            try:
                st = self.p2p.nat.status()
                kinds = connection_kinds(self.p2p.host)
                m = self.metrics
                m.reachable.set(STATUS_VALUE[st["status"]])
                m.relay_addrs.set(len(st["relay_addrs"]))
                m.relayed_bytes.set(st["relayed_bytes"])
                for kind in ("direct", "relayed"):
                    m.peers.labels(kind).set(sum(1 for k in kinds.values() if k == kind))
                now = (st["status"], tuple(st["relay_addrs"]), tuple(sorted(kinds.items())))
                if now != last:
                    last = now
                    self._write_info()
            except Exception as exc:  # reported again on the next pass
                log.info("nat_report_failed", error=repr(exc))

    async def _pump(self, chan: trio.MemoryReceiveChannel[Announcement]) -> None:
        async for ann in chan:
            await self.intake.take(ann)

    async def _solver_peer_of(self, job_id: int) -> str | None:
        """The peer id of the job's current solver, from the chain (None if none)."""
        c = self.chain_client
        if not 1 <= job_id <= await self.chain(c.market.job_count):  # ids start at 1
            return None
        # an announced id, in the market's range (checked above): a job id from here on
        job = await self.chain(c.market.get_job, JobId(job_id))
        if int(job.solver, 16) == 0:
            return None
        return str((await self.chain(c.registry.node_of, job.solver)).peer_id)

    # --- garbage collection ---------------------------------------------------------

    async def _gc_loop(self) -> None:
        while True:
            await trio.sleep(GC_EVERY_S)
            try:
                await self.collect_garbage()
            except Exception as exc:  # retried on the next pass; never fatal
                log.warning("gc_failed", error=repr(exc))

    async def collect_garbage(self, part_max_age_s: float = PART_MAX_AGE_S) -> dict[str, int]:
        """Delete stale interrupted downloads, and what was fetched for jobs that are
        settled (final or cancelled, no dispute open). Only artifacts pinned for a
        job ("job:N") are ever deleted here: what the node publishes stays."""
        store = self.p2p.store
        parts = await trio.to_thread.run_sync(store.gc_partials, part_max_age_s)
        reasons = {r for rs in (await trio.to_thread.run_sync(store.pins)).values() for r in rs}
        freed = 0
        for reason in sorted(reasons):
            if not reason.startswith("job:") or not reason[4:].isdigit():
                continue
            jid = int(reason[4:])
            if jid not in self._settled:
                job = await self.chain(self.chain_client.market.get_job, jid)
                if job.status not in (JobStatus.FINALIZED, JobStatus.CANCELLED) \
                        or job.open_disputes:
                    continue
                self._settled.add(jid)
            freed += len(await trio.to_thread.run_sync(store.release, reason))
        if parts or freed:
            log.info("gc", partials=len(parts), artifacts=freed)
        return {"partials": len(parts), "artifacts": freed}

    # --- chain -------------------------------------------------------------------

    async def chain(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking web3 call in a worker thread, waiting out a dead RPC.

        A transaction whose receipt was lost to an outage may have been mined: the
        retry then reverts with a custom error that callers treat as done.
        """
        deadline = time.monotonic() + RPC_PATIENCE_S
        delay = 0.5
        while True:
            try:
                return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
            except RpcUnavailable as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("rpc_unavailable_retrying", error=str(exc), retry_in=delay)
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def transact_ok(self, fn: Callable[..., Any], *args: Any,
                          benign: tuple[str, ...] = ()) -> bool:
        """Send a transaction; a revert named in ``benign`` (someone else did it
        first, or our own earlier try landed) is logged and returns False."""
        errors(*benign)  # a name no contract has would turn a benign revert into a crash
        try:
            await self.chain(fn, *args)
            return True
        except ContractRevert as exc:
            if exc.error in benign:
                log.info("tx_not_needed", call=getattr(fn, "__name__", str(fn)),
                         error=exc.error)
                return False
            raise

    async def start_step(self, what: str, step: Callable[[], Awaitable[T]]) -> T:
        """Run one start-up step, retrying it on a failure of the transport or of the RPC
        node (:func:`node.chain.rpc.node_failure`: a -32603 "internal error", a reset)
        with the RPC layer's backoff, at most ``STARTUP_ATTEMPTS`` times. Before this a
        daemon exited on the first such answer, before its loop ran. What a person must
        fix (a revert such as too little stake, the wrong chain) ends it at once."""
        for attempt in range(STARTUP_ATTEMPTS):
            try:
                return await step()
            except Exception as exc:
                if not node_failure(exc):
                    raise
                if attempt == STARTUP_ATTEMPTS - 1:
                    url = self.settings.rpc_url or "the deployment's rpc_url"
                    raise ChainError(
                        f"start-up step '{what}' failed {STARTUP_ATTEMPTS} times, the last "
                        f"with: {exc}; the RPC node at {url} keeps failing: check it, or "
                        "point rpc_url at another one") from exc
                delay = backoff_delay(self.settings.rpc, attempt)
                log.warning("startup_retry", step=what, error=str(exc) or repr(exc),
                            attempt=attempt + 1, of=STARTUP_ATTEMPTS, retry_in=round(delay, 2))
                await trio.sleep(delay)
        raise AssertionError("unreachable")

    async def ensure_registered(self, roles: int, stake: int, world_size: int = 1) -> None:
        """Register (with a measured capability profile) and top the stake up to
        ``stake``; a node error on the way is retried (:meth:`start_step`): each try
        re-reads the registry, so a registration that landed unanswered is not repeated."""
        profile = json.dumps({**await trio.to_thread.run_sync(measure_profile, world_size),
                              "name": self.settings.name}, sort_keys=True)
        await self.start_step("register", lambda: self._register(roles, stake, profile))
        await self.start_step("stake metrics", self.refresh_stake_metrics)

    async def _register(self, roles: int, stake: int, profile: str) -> None:
        c = self.chain_client
        info = await self.chain(c.registry.node_of, self.address)
        peer_id = self.p2p.peer_id.to_base58()
        if not info.registered:
            await self.chain(c.registry.register, roles, peer_id, self.p2p.addrs, profile)
            log.info("registered", roles=roles, peer_id=peer_id)
        elif info.peer_id != peer_id or list(info.multiaddrs) != self.p2p.addrs \
                or info.roles != roles:
            await self.chain(c.registry.update_node, roles, peer_id, self.p2p.addrs, profile)
            log.info("registration_updated", roles=roles, addrs=self.p2p.addrs)
        # Seats' locked slashes are still this node's stake: no top-up for them.
        have = info.free_stake + info.locked_stake + info.seat_locked_stake
        if have < stake:
            held = await self.chain(c.token.balance_of, self.address)
            if held < stake - have:  # no retry mends this: say what to change
                raise ConfigError(
                    f"the stake setting asks for {wei_to_pol(stake)} POL staked; "
                    f"{self.address} has {wei_to_pol(have)} POL staked and holds "
                    f"{wei_to_pol(held)} POL: send it {wei_to_pol(stake - have - held)} POL "
                    "more, or lower `stake` in the config (POLNET_STAKE, in wei)")
            await self.chain(c.token.ensure_allowance, c.registry.address, stake - have)
            await self.chain(c.registry.stake, stake - have)
            log.info("staked", pol=wei_to_pol(stake - have))

    async def refresh_stake_metrics(self) -> None:
        c = self.chain_client
        info = await self.chain(c.registry.node_of, self.address)
        self.metrics.stake.labels("free").set(info.free_stake)
        self.metrics.stake.labels("locked").set(info.locked_stake)
        # What this node's juror / attestor seats would lose to a slash, until they end.
        self.metrics.stake.labels("seat").set(info.seat_locked_stake)

    async def credits_owed(self) -> int:
        """What the market and the dispute game owe this account (pulled by withdraw_all)."""
        c = self.chain_client
        return await self.chain(c.market.credits, self.address) + \
            await self.chain(c.dispute.credits, self.address)

    async def withdraw_all(self) -> int:
        """Pull every credit this account has in the market and the dispute game."""
        c = self.chain_client
        total = 0
        for book in (c.market, c.dispute):
            if await self.chain(book.credits, self.address) > 0:
                try:
                    total += await self.chain(book.withdraw)
                except ContractRevert as exc:  # a concurrent (or retried) withdraw took it
                    if exc.error not in WITHDRAW_BENIGN:
                        raise
                    log.info("tx_not_needed", call="withdraw", error=exc.error)
        if total:
            self.metrics.credits_withdrawn.inc(total)
            log.info("withdrawn", pol=wei_to_pol(total))
        # Withdrawals follow settlements, which also lock and unlock stake: keep the
        # stake gauges true (they kept a paid job's bond as locked).
        await self.refresh_stake_metrics()
        return total

    # --- artifacts ----------------------------------------------------------------

    async def peer_addrs_of(self, account: str) -> list[str]:
        """Full /p2p multiaddrs a registered node published on chain."""
        info = await self.chain(self.chain_client.registry.node_of, account)
        return [a if "/p2p/" in a else f"{a}/p2p/{info.peer_id}" for a in info.multiaddrs]

    async def fetch(self, artifact_id: str, hint_accounts: tuple[str, ...] = (),
                    timeout: float = 120.0, expected_size: int | None = None,
                    job_id: JobId | None = None) -> Path:
        """Fetch an artifact into the store and return its path.

        Sources in turn, each with a budget of its own so that none eats the
        others' time: the hinted registry nodes first (the party who must serve,
        e.g. the job's solver), then DHT providers, then bootstrap peers; again
        until `timeout`. Verified chunks carry over from one source to the next.
        What this call downloads is pinned for its job (`job_id`, or the job the
        book knows it from), so garbage collection frees it once the job is
        settled; what the store already held (e.g. what we publish) is left alone.
        The pin comes first: a download cut off for good (its job settled before it
        finished) is deleted with the job's other artifacts, not kept for hours.
        """
        store = self.p2p.store
        if store.has(artifact_id):  # ours (published) or fetched before: pins unchanged
            return store.path(artifact_id)
        jid = job_id if job_id is not None else self.book.job_of(artifact_id)
        if jid is not None and jid not in self._settled:
            await trio.to_thread.run_sync(store.pin, artifact_id, f"job:{jid}")
        await self._fetch_from_sources(artifact_id, hint_accounts, timeout, expected_size)
        return store.path(artifact_id)

    async def _fetch_from_sources(self, artifact_id: str, hint_accounts: tuple[str, ...],
                                  timeout: float, expected_size: int | None) -> None:
        async def sources() -> list[Source]:
            out: list[Source] = []
            for acct in hint_accounts:
                try:
                    with trio.fail_after(10.0):
                        out.append((f"hint {acct[:10]}", await self.peer_addrs_of(acct)))
                except Exception as exc:  # a stale registry entry is not fatal
                    log.info("hint_unresolved", account=acct, error=repr(exc))
            out.append(("dht", None))
            if self.settings.p2p.bootstrap:
                out.append(("bootstrap", list(self.settings.p2p.bootstrap)))
            return out

        await fetch_in_turn(self.p2p, artifact_id, sources, timeout, expected_size)


Source = tuple[str, list[str] | None]  # (name, multiaddrs; None = DHT providers)


def source_budget(name: str, timeout: float) -> float:
    """A source's own slice of a fetch's time: the hinted party half, others a quarter."""
    share = 0.5 if name.startswith("hint") else 0.25
    return max(5.0, timeout * share)


async def fetch_in_turn(node: PolnetNode, artifact_id: str,
                        sources: Callable[[], Awaitable[list[Source]]], timeout: float,
                        expected_size: int | None = None) -> None:
    """Try `sources()` in order, each within its own budget, again until `timeout`.

    A source that hangs (a peer that never answers, a slow DHT walk) loses only
    its budget; verified chunks carry over to the next source.
    """
    deadline = trio.current_time() + timeout
    errors: list[str] = []
    for _round in range(1000):  # bounded; the deadline ends it long before
        with trio.move_on_after(max(0.0, deadline - trio.current_time())):
            listed = await sources()
        for name, peers in listed:
            left = deadline - trio.current_time()
            if left <= 0:
                break
            budget = min(left, source_budget(name, timeout))
            with trio.move_on_after(budget) as scope:
                try:
                    await node.fetch(artifact_id, peers=peers, expected_size=expected_size)
                    return
                except Exception as exc:  # try the next source
                    errors.append(f"{name}: {type(exc).__name__}: {exc}")
            if scope.cancelled_caught:
                errors.append(f"{name}: not done in its {budget:.0f}s")
                log.info("fetch_source_timed_out", artifact=artifact_id, source=name,
                         budget=round(budget, 1))
        if trio.current_time() + 1.0 >= deadline:
            break
        await trio.sleep(1.0)
    raise PeerUnavailable(f"could not fetch artifact {artifact_id} in {timeout:.0f}s "
                          f"(last errors: {errors[-3:]}); is its provider running?")


async def guarded(what: str, fn: Callable[..., Any], *args: Any) -> None:
    """Run a background task of a daemon; an error is logged, not fatal, because the
    next pass of the daemon's loop reconciles with the chain and retries."""
    try:
        await fn(*args)
    except Exception as exc:
        log.exception("task_failed", task=what, error=repr(exc))


def measure_profile(world_size: int = 1) -> dict[str, Any]:
    """Capability profile published in the registry: device, memory, throughput, and
    the ranks a job gets (``world_size``, node.train.distributed) with the memory they
    share (CPU ranks on one machine: its memory; the claim check compares a job's
    all-rank estimate with it)."""
    import torch  # noqa: PLC0415

    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for _ in range(20):
        a = torch.tanh(a @ a)
    dt = time.perf_counter() - t0
    gflops = 20 * 2 * 256**3 / dt / 1e9
    return {"device": "cpu", "threads": torch.get_num_threads(), "memory_mb": int(mem_mb),
            "matmul_gflops": round(gflops, 2), "world_size": world_size,
            "aggregate_memory_mb": int(mem_mb)}


def node_info(home: Path, name: str) -> dict[str, Any]:
    """The node.json another process wrote (see Runtime._write_info)."""
    return json.loads((home / "nodes" / name / "node.json").read_text())  # type: ignore[no-any-return]
