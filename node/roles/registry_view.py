"""Who the network should trust off-chain, followed from the chain's events.

Serving slots, announcements and other off-chain privileges go to nodes with
slashable stake (free + locked >= the lower of the minimum verifier and solver
stake), never to a registration alone (it costs only gas), and first to the
parties and jurors of a dispute that is live. The view is incremental: each
`refresh` reads the new registry and dispute events and one `nodeOf` per node
whose registration or stake they touched, so its RPC cost follows events, never
requests or peers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node.chain.client import ChainClient
from node.chain.events import ChainEvent, EventWatcher

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
    disputes: dict[int, set[str]] = field(default_factory=dict)     # live id -> addresses
    min_stake: int | None = None
    _watcher: EventWatcher | None = None

    def refresh(self) -> None:
        """Take in the events since the last call (blocking: run it in a thread)."""
        c = self.client
        assert c.deployment is not None
        if self._watcher is None:
            self._watcher = EventWatcher(c.w3, [c.registry, c.dispute],
                                         start_block=c.deployment.deploy_block)
            self.min_stake = min(int(c.registry.call("minVerifierStake")),
                                 int(c.registry.call("minSolverStake")))
        touched: set[str] = set()
        for ev in self._watcher.poll():
            self._take(ev, touched)
        for addr in touched:
            info = c.registry.node_of(addr)
            node = self.nodes.get(addr)
            if node is not None:
                node.stake = info.free_stake + info.locked_stake

    def _take(self, ev: ChainEvent, touched: set[str]) -> None:
        a = ev.args
        if ev.event in ("NodeRegistered", "NodeUpdated"):
            addr = str(a["node"]).lower()
            old = self.nodes.get(addr)
            self.nodes[addr] = Registered(str(a["peerId"]), list(a["multiaddrs"]),
                                          old.stake if old else 0)
        if ev.event in STAKE_EVENTS and "node" in a:
            touched.add(str(a["node"]).lower())
        elif ev.event == "DisputeOpened":
            self.disputes[int(a["id"])] = {str(a["solver"]).lower(),
                                           str(a["challenger"]).lower()}
        elif ev.event == "JuryDrawn" and int(a["id"]) in self.disputes:
            self.disputes[int(a["id"])] |= {str(j).lower() for j in a["jury"]}
        elif ev.event == "DisputeResolved":
            self.disputes.pop(int(a["id"]), None)

    def peers(self, exclude: str = "") -> list[tuple[str, list[str]]]:
        """(peer id, multiaddrs) of every registered node but `exclude` (an address)."""
        return [(n.peer_id, n.multiaddrs) for addr, n in self.nodes.items()
                if addr != exclude.lower()]

    def staked(self) -> set[str]:
        """Peer ids of registered nodes holding at least the minimum stake."""
        bar = self.min_stake or 0
        return {n.peer_id for n in self.nodes.values() if bar > 0 and n.stake >= bar}

    def seats(self) -> set[str]:
        """Peer ids of the parties and jurors of live disputes."""
        addrs = set().union(*self.disputes.values()) if self.disputes else set()
        return {self.nodes[a].peer_id for a in addrs if a in self.nodes}
