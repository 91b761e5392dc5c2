"""Who the network should trust off-chain, followed from the chain's events.

Serving slots, announcements and other off-chain privileges go to nodes with
slashable stake (free + locked >= the lower of the minimum verifier and solver
stake), never to a registration alone (it costs only gas), and first to the
parties, the job's committee and the jurors of a dispute that is live (and the
jurors of an open outer-jury case). The view is incremental: each
`refresh` reads the new registry and dispute events and one `nodeOf` per node
whose registration or stake they touched, so its RPC cost follows events, never
requests or peers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from node.chain.client import ChainClient
from node.chain.events import ChainEvent, EventWatcher
from node.chain.view import EventFeed
from node.errors import ConfigError

# Events after which a node's free or locked stake may differ.
STAKE_EVENTS = frozenset({"NodeRegistered", "NodeUpdated", "Staked", "UnbondRequested",
                          "StakeLocked", "StakeUnlocked", "Slashed"})


@dataclass
class Registered:
    peer_id: str
    multiaddrs: list[str]
    stake: int = 0  # free + locked


@dataclass
class RegistryView:
    client: ChainClient
    nodes: dict[str, Registered] = field(default_factory=dict)      # address (lower) ->
    # live dispute ("dispute", id) or outer-jury case ("case", id) -> seated addresses
    disputes: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    committees: dict[int, set[str]] = field(default_factory=dict)   # job id -> latest
    min_stake: int | None = None
    # The process's chain view (Runtime): its events, no getLogs of our own. Without
    # one (a tool, a test) the view polls its own EventWatcher.
    feed: EventFeed | None = None
    _watcher: EventWatcher | None = None
    _touched: set[str] = field(default_factory=set)  # stake to read again

    def refresh(self) -> None:
        """Take in the events since the last call (blocking: run it in a thread)."""
        c = self.client
        assert c.deployment is not None
        if self.feed is not None:
            events = self.feed.take()
            if self.feed.restarted:  # a reorg: the new epoch's events come again
                self.nodes.clear()
                self.disputes.clear()
                self.committees.clear()
        else:
            events = self._poll()
        if self.min_stake is None:  # immutable in the contract: read once
            self.min_stake = min(int(c.registry.call("minVerifierStake")),
                                 int(c.registry.call("minSolverStake")))
        # Kept across calls: a lookup that fails (RPC down) is retried next time.
        touched = self._touched
        for ev in events:
            self._take(ev, touched)
        for addr in sorted(touched):
            info = c.registry.node_of(addr)
            node = self.nodes.get(addr)
            if node is not None:
                node.stake = info.free_stake + info.locked_stake
            touched.discard(addr)

    def _poll(self) -> list[ChainEvent]:
        c = self.client
        assert c.deployment is not None
        if self._watcher is None:
            watched: list[Any] = [c.registry, c.dispute, c.market]
            with contextlib.suppress(ConfigError):  # a deployment without collab jobs
                watched.append(c.outer_jury)
            self._watcher = EventWatcher(c.w3, watched, start_block=c.deployment.deploy_block)
        return self._watcher.poll()

    def _take(self, ev: ChainEvent, touched: set[str]) -> None:
        a = ev.args
        if ev.event in ("NodeRegistered", "NodeUpdated"):
            addr = str(a["node"]).lower()
            old = self.nodes.get(addr)
            self.nodes[addr] = Registered(str(a["peerId"]), list(a["multiaddrs"]),
                                          old.stake if old else 0)
        if ev.event in STAKE_EVENTS and "node" in a:
            touched.add(str(a["node"]).lower())
        elif ev.event == "CommitteeDrawn":
            self.committees[int(a["jobId"])] = {str(m).lower() for m in a["committee"]}
        elif ev.event == "DisputeOpened":  # its parties and the job's committee
            self.disputes[("dispute", int(a["id"]))] = {
                str(a["solver"]).lower(), str(a["challenger"]).lower(),
                *self.committees.get(int(a["jobId"]), set())}
        elif ev.event == "JuryDrawn" and ev.contract == "DisputeGame":
            key = ("dispute", int(a["id"]))
            if key in self.disputes:
                self.disputes[key] |= {str(j).lower() for j in a["jury"]}
        elif ev.event == "JuryDrawn":  # an outer jury's case, live until tallied
            self.disputes[("case", int(a["caseId"]))] = {str(j).lower() for j in a["jury"]}
        elif ev.event == "DisputeResolved" and ev.contract == "DisputeGame":
            self.disputes.pop(("dispute", int(a["id"])), None)
        elif ev.event == "CaseTallied":
            self.disputes.pop(("case", int(a["caseId"])), None)

    def peers(self, exclude: str = "") -> list[tuple[str, list[str]]]:
        """(peer id, multiaddrs) of every registered node but `exclude` (an address)."""
        return [(n.peer_id, n.multiaddrs) for addr, n in self.nodes.items()
                if addr != exclude.lower()]

    def accounts(self) -> dict[str, str]:
        """Peer id -> account (lower case) of every registered node, latest wins."""
        return {n.peer_id: addr for addr, n in self.nodes.items()}

    def staked(self) -> set[str]:
        """Peer ids of registered nodes holding at least the minimum stake."""
        bar = self.min_stake or 0
        return {n.peer_id for n in self.nodes.values() if bar > 0 and n.stake >= bar}

    def seats(self) -> set[str]:
        """Peer ids of the parties, the job's committee and the jurors of live disputes,
    and of the jurors of open outer-jury cases."""
        addrs = set().union(*self.disputes.values()) if self.disputes else set()
        return {self.nodes[a].peer_id for a in addrs if a in self.nodes}
