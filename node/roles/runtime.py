"""What every long-running role shares: settings, the chain client, the artifact
store, the libp2p node, announcements heard, metrics.

One trio loop per process: the p2p node runs on it; web3 calls and torch work
go to worker threads through :meth:`Runtime.chain` and ``trio.to_thread``.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from node.chain.client import ChainClient
from node.chain.deployment import Deployment
from node.chain.events import EventWatcher
from node.config import NodeSettings
from node.errors import ContractRevert, PeerUnavailable, RpcUnavailable
from node.logs import get_logger
from node.p2p import NodeConfig as P2PConfig
from node.p2p import PolnetNode
from node.p2p.announce import Announcement
from node.roles import announce_kinds  # noqa: F401 - registers the dispute kinds
from node.roles.metrics import Metrics

SOLVER, VERIFIER = 1, 2
T = TypeVar("T")
log = get_logger("polnet.runtime")

RPC_PATIENCE_S = 120.0  # how long a node waits out a dead RPC before giving up


class AnnouncementBook:
    """What peers announced, by job. Only hints: every artifact fetched is checked
    against hashes on chain before use."""

    def __init__(self) -> None:
        self.manifests: dict[int, list[str]] = {}
        self.states: dict[tuple[int, str], str] = {}
        self.specs: dict[str, list[str]] = {}  # spec artifact id -> announcer peers

    def add(self, ann: Announcement) -> None:
        p = ann.payload
        if ann.kind == "result_committed" and p.get("artifact_ids"):
            ids = self.manifests.setdefault(int(p["job_id"]), [])
            if p["artifact_ids"][0] not in ids:
                ids.append(p["artifact_ids"][0])
        elif ann.kind == "state_served":
            self.states[(int(p["job_id"]), str(p["state_hash"]).lower())] = p["artifact_id"]


class Runtime:
    """Enter with ``async with Runtime(settings, role="solver") as rt``."""

    def __init__(self, settings: NodeSettings, role: str) -> None:
        self.settings = settings
        self.role = role
        self.dir = settings.node_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.book = AnnouncementBook()
        self.metrics = Metrics.create()
        self._chain: ChainClient | None = None
        self._p2p: PolnetNode | None = None
        self.metrics_port: int | None = None

    @property
    def chain_client(self) -> ChainClient:
        assert self._chain is not None, "runtime not entered"
        return self._chain

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
        self._chain = await self.chain(ChainClient, self.settings.rpc_url or dep.rpc_url, key,
                                       dep)
        cfg = P2PConfig.in_dir(self.dir / "p2p", listen=self.settings.listen,
                               bootstrap=list(self.settings.bootstrap))
        self._p2p = PolnetNode(cfg)
        await self._p2p.__aenter__()
        assert self._p2p.nursery is not None
        for kind in ("result_committed", "state_served"):
            chan = await self._p2p.subscribe(kind)
            self._p2p.nursery.start_soon(self._pump, chan)
        self._p2p.nursery.start_soon(self._registry_peers_loop)
        if self.settings.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.settings.metrics_port)
        self._write_info()
        log.info("node_up", role=self.role, name=self.settings.name, address=self.address,
                 peer_id=self._p2p.peer_id.to_base58(), addrs=self._p2p.addrs,
                 metrics_port=self.metrics_port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._p2p is not None:
            await self._p2p.__aexit__(*exc)

    def _write_info(self) -> None:
        """node.json: how other local processes (the demo, tests) reach this node."""
        info = {"role": self.role, "address": self.address, "pid": os.getpid(),
                "peer_id": self.p2p.peer_id.to_base58(), "addrs": self.p2p.addrs,
                "metrics_port": self.metrics_port}
        tmp = self.dir / "node.json.tmp"
        tmp.write_text(json.dumps(info, indent=2))
        os.replace(tmp, self.dir / "node.json")

    def _registered_peers(self) -> list[tuple[str, list[str]]]:
        """Peer id + multiaddrs of every registered node, latest registration wins."""
        c = self.chain_client
        assert c.deployment is not None
        watcher = EventWatcher(c.w3, [c.registry], start_block=c.deployment.deploy_block)
        latest: dict[str, tuple[str, list[str]]] = {}
        for ev in watcher.fetch(c.deployment.deploy_block, c.block_number()):
            if ev.event in ("NodeRegistered", "NodeUpdated"):
                latest[str(ev.args["node"])] = (str(ev.args["peerId"]),
                                                list(ev.args["multiaddrs"]))
        return [v for k, v in latest.items() if k.lower() != self.address.lower()]

    async def _registry_peers_loop(self) -> None:
        """Discovery from the chain: dial what the registry lists, now and then again,
        so a restarted node (new port) and its peers find each other without luck."""
        known: set[tuple[str, tuple[str, ...]]] = set()
        while True:
            try:
                peers = await self.chain(self._registered_peers)
                fresh = [(p, a) for p, a in peers if (p, tuple(a)) not in known]
                if fresh:
                    n = await self.p2p.add_registry_peers(fresh)
                    known.update((p, tuple(a)) for p, a in fresh)
                    log.info("registry_peers", new=len(fresh), reachable=n)
            except Exception as exc:  # discovery is retried; never fatal
                log.warning("registry_peers_failed", error=repr(exc))
            await trio.sleep(5.0)

    async def _pump(self, chan: trio.MemoryReceiveChannel[Announcement]) -> None:
        async for ann in chan:
            self.book.add(ann)

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
        try:
            await self.chain(fn, *args)
            return True
        except ContractRevert as exc:
            if exc.error in benign:
                log.info("tx_not_needed", call=getattr(fn, "__name__", str(fn)),
                         error=exc.error)
                return False
            raise

    async def ensure_registered(self, roles: int, stake: int) -> None:
        """Register (with a measured capability profile) and top the stake up to ``stake``."""
        c = self.chain_client
        info = await self.chain(c.registry.node_of, self.address)
        peer_id = self.p2p.peer_id.to_base58()
        profile = json.dumps(await trio.to_thread.run_sync(measure_profile), sort_keys=True)
        if not info.registered:
            await self.chain(c.registry.register, roles, peer_id, self.p2p.addrs, profile)
            log.info("registered", roles=roles, peer_id=peer_id)
        elif info.peer_id != peer_id or list(info.multiaddrs) != self.p2p.addrs \
                or info.roles != roles:
            await self.chain(c.registry.update_node, roles, peer_id, self.p2p.addrs, profile)
            log.info("registration_updated", roles=roles, addrs=self.p2p.addrs)
        have = await self.chain(c.registry.free_stake, self.address) + \
            await self.chain(c.registry.locked_stake, self.address)
        if have < stake:
            await self.chain(c.token.ensure_allowance, c.registry.address, stake - have)
            await self.chain(c.registry.stake, stake - have)
            log.info("staked", amount=stake - have)
        await self.refresh_stake_metrics()

    async def refresh_stake_metrics(self) -> None:
        c = self.chain_client
        self.metrics.stake.labels("free").set(await self.chain(c.registry.free_stake,
                                                               self.address))
        self.metrics.stake.labels("locked").set(await self.chain(c.registry.locked_stake,
                                                                 self.address))

    async def withdraw_all(self) -> int:
        """Pull every credit this account has in the market and the dispute game."""
        c = self.chain_client
        total = 0
        if await self.chain(c.market.credits, self.address) > 0:
            total += await self.chain(c.market.withdraw)
        if await self.chain(c.dispute.credits, self.address) > 0:
            total += await self.chain(c.dispute.withdraw)
        if total:
            self.metrics.credits_withdrawn.inc(total)
            log.info("withdrawn", amount=total)
        return total

    # --- artifacts ----------------------------------------------------------------

    async def peer_addrs_of(self, account: str) -> list[str]:
        """Full /p2p multiaddrs a registered node published on chain."""
        info = await self.chain(self.chain_client.registry.node_of, account)
        return [a if "/p2p/" in a else f"{a}/p2p/{info.peer_id}" for a in info.multiaddrs]

    async def fetch(self, artifact_id: str, hint_accounts: tuple[str, ...] = (),
                    timeout: float = 120.0) -> Path:
        """Fetch an artifact into the store (DHT providers first, then the hinted
        registry nodes' addresses, then bootstrap peers) and return its path."""
        store = self.p2p.store
        if store.has(artifact_id):
            return store.path(artifact_id)
        errors: list[str] = []
        with trio.move_on_after(timeout):
            while True:
                candidates: list[list[str] | None] = [None]
                for acct in hint_accounts:
                    try:
                        candidates.append(await self.peer_addrs_of(acct))
                    except Exception as exc:  # a stale registry entry is not fatal
                        errors.append(repr(exc))
                if self.settings.bootstrap:
                    candidates.append(list(self.settings.bootstrap))
                for peers in candidates:
                    try:
                        await self.p2p.fetch(artifact_id, peers=peers)
                        return store.path(artifact_id)
                    except Exception as exc:  # try the next source
                        errors.append(f"{type(exc).__name__}: {exc}")
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


def measure_profile() -> dict[str, Any]:
    """Capability profile published in the registry: device, memory, throughput."""
    import torch  # noqa: PLC0415

    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for _ in range(20):
        a = torch.tanh(a @ a)
    dt = time.perf_counter() - t0
    gflops = 20 * 2 * 256**3 / dt / 1e9
    return {"device": "cpu", "threads": torch.get_num_threads(), "memory_mb": int(mem_mb),
            "matmul_gflops": round(gflops, 2)}


def node_info(home: Path, name: str) -> dict[str, Any]:
    """The node.json another process wrote (see Runtime._write_info)."""
    return json.loads((home / "nodes" / name / "node.json").read_text())  # type: ignore[no-any-return]
