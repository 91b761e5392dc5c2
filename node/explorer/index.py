"""What the explorer shows, read from the chain and the node's own files.

One :class:`Snapshot` per chain head: every job (``getJob``), every dispute the game
opened (``getDispute``), every registered node (``nodeOf``) and all events of the
three contracts, fetched once and grouped, so a page costs no RPC of its own. Event
logs are read in bounded block ranges. Nothing here writes to the chain or to disk.

Loss curves come from trace manifests on this machine (a solver's
``HOME/nodes/*/jobs/<job>-r<round>/trace/trace.json``), shown only when the
manifest's root is the one committed on chain for that round.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.chain.client import ChainClient
from node.chain.contracts import DisputeState, Job, NodeInfo
from node.chain.events import ChainEvent, EventWatcher
from node.chain.payouts import job_payouts
from node.errors import CheckpointError, MalformedInput, PolnetError, TrainingError

if TYPE_CHECKING:
    from node.spec import JobSpec

MAX_JOBS = 500  # the newest; older ones are still reachable by id
LOG_RANGE = 5_000  # blocks per eth_getLogs
MAX_TRACE_DIRS = 64  # manifests looked at per job


@dataclass(frozen=True)
class LossCurve:
    losses: list[float]  # segment mean losses, in order
    steps_per_segment: int
    source: str  # the file it was read from
    round: int
    tokens_per_step: int | None = None  # a language model's batch x context (the spec's)

    def rows(self) -> list[dict[str, Any]]:
        """Per segment: its index, last step, tokens seen by its end (a language model
        whose spec a node here holds; else None) and its mean loss."""
        k, per = self.steps_per_segment, self.tokens_per_step
        return [{"segment": i, "step": (i + 1) * k,
                 "tokens_seen": None if per is None else (i + 1) * k * per, "loss": loss}
                for i, loss in enumerate(self.losses)]


def find_loss_curve(home: Path, job_id: int, job: Job) -> LossCurve | None:
    """The committed round's segment losses from a trace manifest under ``home``'s node
    folders whose root is the one on chain; tokens per step from the job's spec when a
    node here holds it."""
    from node.train.trace import read_manifest  # noqa: PLC0415  (torch: only when asked)

    if job.trace_root == bytes(32):
        return None
    root = job.trace_root.hex()
    dirs = sorted((home / "nodes").glob(f"*/jobs/{job_id}-r{job.round}/trace"))
    for d in dirs[:MAX_TRACE_DIRS]:
        try:
            m = read_manifest(d)
        except (OSError, MalformedInput, CheckpointError, TrainingError):
            continue  # someone else's half-written or corrupt file: not evidence
        if m.job_id == job_id and m.root.removeprefix("0x") == root:
            spec = find_spec(home, job.spec_hash)
            return LossCurve(list(m.losses), m.k, str(d / "trace.json"), job.round,
                             None if spec is None else spec.tokens_per_step)
    return None


def find_spec(home: Path, spec_hash: bytes) -> JobSpec | None:
    """The job's spec (a JobSpec), if a node under ``home`` holds it in its store
    (``nodes/NAME/p2p/store``; the artifact id is the hash on chain, so the store
    checked it); None otherwise."""
    from node.spec import MAX_SPEC_BYTES, parse_spec_json  # noqa: PLC0415

    h = spec_hash.hex()
    for p in sorted((home / "nodes").glob(f"*/p2p/store/objects/{h[:2]}/{h}"))[:8]:
        try:
            if p.stat().st_size > MAX_SPEC_BYTES:
                continue
            return parse_spec_json(p.read_bytes())
        except (OSError, ValueError, PolnetError):
            continue  # not evidence of anything: the page shows the hash alone
    return None


@dataclass
class NodeRecord:
    address: str
    info: NodeInfo
    jobs_solved: int = 0
    steps_delivered: int = 0
    rewards: int = 0
    attestations: int = 0
    slashed: int = 0
    slashes: list[dict[str, Any]] = field(default_factory=list)
    market_credits: int = 0
    game_credits: int = 0


@dataclass
class Snapshot:
    head: int
    timestamp: int
    chain_id: int
    addresses: dict[str, str]
    job_count: int
    jobs: dict[int, Job]
    job_events: dict[int, list[ChainEvent]]
    disputes: dict[int, DisputeState]
    dispute_events: dict[int, list[ChainEvent]]
    nodes: dict[str, NodeRecord]
    taken_at: float

    def payouts(self, job_id: int) -> list[dict[str, Any]]:
        return job_payouts(self.job_events.get(job_id, []))

    def disputes_of(self, job_id: int) -> list[DisputeState]:
        return [d for d in self.disputes.values() if d.job_id == job_id]

    def ranges(self, dispute_id: int) -> list[tuple[int, int]]:
        """The bisection range after each round, starting with the whole segment."""
        d = self.disputes[dispute_id]
        out = [(d.start_step, d.end_step)]
        for e in self.dispute_events.get(dispute_id, []):
            if e.event == "RangeNarrowed":
                out.append((int(e.args["lo"]), int(e.args["hi"])))
        return out


class ChainIndex:
    """Builds snapshots, one per head block (pages served at one head share it)."""

    def __init__(self, client: ChainClient, home: Path | None = None,
                 min_age_s: float = 1.0) -> None:
        self.c = client
        self.home = home
        self.min_age_s = min_age_s
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._events: list[ChainEvent] = []
        self._scanned_to: int | None = None
        dep = client.deployment
        self._start = dep.deploy_block if dep is not None else 0
        self._watcher = EventWatcher(client.w3, [client.market, client.dispute, client.registry],
                                     start_block=self._start)

    def snapshot(self) -> Snapshot:
        with self._lock:
            s = self._snap
            if s is not None and time.monotonic() - s.taken_at < self.min_age_s:
                return s
            head = self.c.block_number()
            if s is not None and s.head == head:
                return s
            self._snap = self._build(head)
            return self._snap

    def _new_events(self, head: int) -> list[ChainEvent]:
        # Logs are immutable on a chain that does not reorg (anvil); read each range once.
        start = self._start if self._scanned_to is None else self._scanned_to + 1
        for lo in range(start, head + 1, LOG_RANGE):
            self._events.extend(self._watcher.fetch(lo, min(head, lo + LOG_RANGE - 1)))
        self._scanned_to = head
        return self._events

    def _build(self, head: int) -> Snapshot:
        c = self.c
        events = self._new_events(head)
        count = c.market.job_count()
        jobs = {i: c.market.get_job(i) for i in range(max(1, count - MAX_JOBS + 1), count + 1)}
        job_events: dict[int, list[ChainEvent]] = defaultdict(list)
        dispute_events: dict[int, list[ChainEvent]] = defaultdict(list)
        node_addrs: list[str] = []
        for e in events:
            if e.contract == "DisputeGame" and "id" in e.args:
                dispute_events[int(e.args["id"])].append(e)
            elif "jobId" in e.args:
                job_events[int(e.args["jobId"])].append(e)
            if e.event == "NodeRegistered":
                node_addrs.append(str(e.args["node"]))
        disputes = {did: c.dispute.get_dispute(did) for did in sorted(dispute_events)
                    if any(e.event == "DisputeOpened" for e in dispute_events[did])}
        nodes = {a: NodeRecord(a, c.registry.node_of(a)) for a in node_addrs}
        self._tally(nodes, jobs, events)
        for a, n in nodes.items():
            n.market_credits = c.market.credits(a)
            n.game_credits = c.dispute.credits(a)
        blk = c.w3.eth.get_block(head)
        addresses = {"token": str(c.token.address), "registry": str(c.registry.address),
                     "market": str(c.market.address), "dispute": str(c.dispute.address)}
        return Snapshot(head=head, timestamp=int(blk["timestamp"]), chain_id=int(c.w3.eth.chain_id),
                        addresses=addresses, job_count=count, jobs=jobs,
                        job_events=dict(job_events), disputes=disputes,
                        dispute_events=dict(dispute_events), nodes=nodes,
                        taken_at=time.monotonic())

    @staticmethod
    def _tally(nodes: dict[str, NodeRecord], jobs: dict[int, Job],
               events: list[ChainEvent]) -> None:
        # The registry's Slashed names no job: the market or game event of the same
        # transaction does (finalize reopening a job, a dispute resolved).
        cause: dict[str, dict[str, int]] = defaultdict(dict)
        for e in events:
            if e.contract == "DisputeGame" and "id" in e.args:
                cause[e.tx_hash].setdefault("dispute", int(e.args["id"]))
            if "jobId" in e.args:
                cause[e.tx_hash].setdefault("job", int(e.args["jobId"]))
        for e in events:
            a = e.args
            if e.event == "JobFinalized" and str(a["solver"]) in nodes:
                n = nodes[str(a["solver"])]
                n.jobs_solved += 1
                n.rewards += int(a["reward"])
                job = jobs.get(int(a["jobId"]))
                n.steps_delivered += job.total_steps if job is not None else 0
            elif e.event == "Attested" and str(a["verifier"]) in nodes:
                nodes[str(a["verifier"])].attestations += 1
            elif e.event == "Slashed" and str(a["node"]) in nodes and int(a["amount"]):
                n = nodes[str(a["node"])]
                n.slashed += int(a["amount"])
                n.slashes.append({"block": e.block_number, "amount": int(a["amount"]),
                                  "from": "locked bond or seat" if a["fromLocked"]
                                  else "free stake",
                                  "job": cause[e.tx_hash].get("job"),
                                  "dispute": cause[e.tx_hash].get("dispute")})

    # --- the node's own files ----------------------------------------------------------

    def loss_curve(self, job_id: int, job: Job) -> LossCurve | None:
        """The committed round's segment losses, if a manifest here has that root."""
        return None if self.home is None else find_loss_curve(self.home, job_id, job)

    def spec_name(self, spec_hash: bytes) -> str:
        """The name in the job's spec, if a node here holds the spec (its artifact id is
        the hash on chain, so the store checked it); "" otherwise."""
        spec = None if self.home is None else find_spec(self.home, spec_hash)
        return "" if spec is None else spec.name
