"""What the explorer shows, read from the chain and the node's own files.

The chain side is a :class:`node.chain.view.ChainView` (the daemons' event-driven,
batched view): per new block it costs the view's ``eth_blockNumber``, one batch of
headers and logs, and one batch of ``eth_call`` for the jobs, disputes and
collaborative jobs the block's events touched. On top of it the index keeps the
events it has taken in, grouped by job, dispute, collaborative job and outer-jury
case, and per node the figures derived from them (rewards, attestations, slashes);
a node's registry entry and credits are read (one batch) only when a new event names
it. So a block costs requests in proportion to its events, not to the jobs on chain.
A reorg (the view's ``epoch`` changes) rebuilds the index from the new epoch's events.
Nothing here writes to the chain or to disk.

Loss curves come from trace manifests on this machine (a solver's
``HOME/nodes/*/jobs/<job>-r<round>/trace/trace.json``), shown only when the
manifest's root is the one committed on chain for that round.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.chain.bound import Bound, batch_call
from node.chain.client import ChainClient
from node.chain.contracts import CollabJob, DisputeState, Job, NodeInfo, from_struct
from node.chain.events import ChainEvent
from node.chain.ids import CaseId, CollabId, DisputeId, JobId
from node.chain.payouts import job_payouts
from node.chain.view import BATCH_MAX, ChainView, EventFeed
from node.chain.view import Snapshot as ViewSnapshot
from node.errors import CheckpointError, MalformedInput, PolnetError, TrainingError

if TYPE_CHECKING:
    from node.spec import JobSpec

MAX_JOBS = 500  # rows of the jobs page, the newest; older ones are reachable by id
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


def find_loss_curve(home: Path, job_id: JobId, job: Job) -> LossCurve | None:
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
class NodeTally:
    """What a node's events add up to (kept per node, grown block by block)."""

    jobs_solved: int = 0
    steps_delivered: int = 0
    rewards: int = 0
    attestations: int = 0
    slashed: int = 0
    slashes: list[dict[str, Any]] = field(default_factory=list)


@dataclass(kw_only=True)
class NodeRecord(NodeTally):
    """A node's page: its tally, registry entry and credits as of a snapshot."""

    address: str
    info: NodeInfo
    market_credits: int = 0
    game_credits: int = 0
    collab_credits: int = 0


@dataclass(frozen=True)
class CollabRound:
    """One attempt of a collaborative job's round, from the CollabMarket's events."""

    round: int
    attempt: int
    started_block: int
    deadline: int
    sub_jobs: tuple[JobId, ...]  # market job id per slot, 0 where the slot had none
    workers: Mapping[int, str]  # slot -> the worker its sub-job was reserved for
    accepted: tuple[int, ...] = ()  # slots whose sub-job was accepted
    dropped: Mapping[int, int] = field(default_factory=dict)  # slot -> SubJobDropped reason
    settled: bool = False
    retried: bool = False  # too few accepted: the round started again (or the job failed)
    per_worker: int = 0  # each accepted worker's share of the round's slashes
    posts: tuple[ChainEvent, ...] = ()  # OuterPosted, OuterChallenged, OuterResolved
    outer_accepted: bytes | None = None  # the accepted outer state's hash


@dataclass(frozen=True)
class JuryCase:
    """An OuterJury case (a challenged outer state), from its events and the challenge's."""

    id: int
    job_id: CollabId  # the collaborative job
    round: int
    requested_block: int
    draw_block: int
    pool_len: int
    challenger: str = ""
    jury: tuple[str, ...] = ()
    commit_end: int = 0
    reveal_end: int = 0
    committed: frozenset[str] = frozenset()
    revealed: Mapping[str, bool] = field(default_factory=dict)  # juror -> voted valid
    slashed: Mapping[str, int] = field(default_factory=dict)  # juror -> amount
    verdict: int | None = None  # IOuterJury.Verdict, once tallied
    valid_votes: int = 0
    invalid_votes: int = 0

    @property
    def phase(self) -> str:
        if self.verdict is not None:
            return "tallied"
        return "voting" if self.jury else "drawing"


@dataclass
class Snapshot:
    head: int
    timestamp: int
    chain_id: int
    addresses: dict[str, str]
    job_count: int
    jobs: Mapping[JobId, Job]
    job_events: Mapping[int, list[ChainEvent]]
    disputes: Mapping[DisputeId, DisputeState]
    dispute_events: Mapping[int, list[ChainEvent]]
    nodes: Mapping[str, NodeRecord]
    taken_at: float
    collabs: Mapping[CollabId, CollabJob] = field(default_factory=dict)
    collab_events: Mapping[int, list[ChainEvent]] = field(default_factory=dict)
    rounds: Mapping[int, list[CollabRound]] = field(default_factory=dict)  # per collab job
    juries: Mapping[CaseId, JuryCase] = field(default_factory=dict)  # by OuterJury case id
    case_events: Mapping[CaseId, list[ChainEvent]] = field(default_factory=dict)
    sub_job_of: Mapping[int, tuple[int, int, int]] = field(default_factory=dict)  # job ->
    # (collaborative job, round, slot)

    def payouts(self, job_id: JobId) -> list[dict[str, Any]]:
        return job_payouts(self.job_events.get(job_id, []))

    def disputes_of(self, job_id: JobId) -> list[DisputeState]:
        return [d for d in self.disputes.values() if d.job_id == job_id]

    def juries_of(self, collab_id: CollabId) -> list[JuryCase]:
        return [c for c in self.juries.values() if c.job_id == collab_id]

    def ranges(self, dispute_id: DisputeId) -> list[tuple[int, int]]:
        """The bisection range after each round, starting with the whole segment."""
        d = self.disputes[dispute_id]
        out = [(d.start_step, d.end_step)]
        for e in self.dispute_events.get(dispute_id, []):
            if e.event == "RangeNarrowed":
                out.append((int(e.args["lo"]), int(e.args["hi"])))
        return out


def collab_rounds(events: Iterable[ChainEvent]) -> list[CollabRound]:
    """A collaborative job's round attempts, in order, from its CollabMarket events."""
    out: list[CollabRound] = []
    cur: dict[int, int] = {}  # round -> index in out of its latest attempt
    posted: dict[int, str] = {}  # market job -> worker: SubJobPosted precedes RoundStarted
    for e in events:
        a = e.args
        if e.event == "SubJobPosted":
            posted[int(a["marketJobId"])] = str(a["worker"])
        if e.event == "RoundStarted":
            r = int(a["round"])
            cur[r] = len(out)
            subs = tuple(JobId(int(j)) for j in a["subJobs"])
            out.append(CollabRound(r, int(a["attempt"]), e.block_number, int(a["deadline"]),
                                   subs, {i: posted[j] for i, j in enumerate(subs)
                                          if j in posted}))
            continue
        if "round" not in a or int(a["round"]) not in cur:
            continue
        i = cur[int(a["round"])]
        rd = out[i]
        if e.event == "SubJobPosted" and int(a["marketJobId"]) in rd.sub_jobs:
            rd = replace(rd, workers={**rd.workers, int(a["slot"]): str(a["worker"])})
        elif e.event == "SubJobAccepted":
            rd = replace(rd, accepted=(*rd.accepted, int(a["slot"])))
        elif e.event == "SubJobDropped":
            rd = replace(rd, dropped={**rd.dropped, int(a["slot"]): int(a["reason"])})
        elif e.event == "RoundSettled":
            rd = replace(rd, settled=True, per_worker=int(a["perWorker"]))
        elif e.event in ("RoundRetried", "CollabFailed"):
            rd = replace(rd, retried=True)
        elif e.event in ("OuterPosted", "OuterChallenged", "OuterResolved"):
            rd = replace(rd, posts=(*rd.posts, e))
        elif e.event == "OuterAccepted":
            rd = replace(rd, outer_accepted=bytes(a["outerHash"]))
        out[i] = rd
    return out


def jury_case(case_id: CaseId, events: Iterable[ChainEvent], challenger: str = "") -> JuryCase:
    """An OuterJury case from its events (JuryRequested first)."""
    c: JuryCase | None = None
    for e in events:
        a = e.args
        if e.event == "JuryRequested":
            c = JuryCase(case_id, CollabId(int(a["jobId"])), int(a["round"]), e.block_number,
                         int(a["drawBlock"]), int(a["poolLen"]), challenger)
        elif c is None:
            continue
        elif e.event == "JuryDrawn":
            c = replace(c, jury=tuple(str(x) for x in a["jury"]), commit_end=int(a["commitEnd"]),
                        reveal_end=int(a["revealEnd"]))
        elif e.event == "VoteCommitted":
            c = replace(c, committed=c.committed | {str(a["juror"])})
        elif e.event == "VoteRevealed":
            c = replace(c, revealed={**c.revealed, str(a["juror"]): bool(a["valid"])})
        elif e.event == "JurorSlashed":
            c = replace(c, slashed={**c.slashed, str(a["juror"]): int(a["amount"])})
        elif e.event == "CaseTallied":
            c = replace(c, verdict=int(a["verdict"]), valid_votes=int(a["validVotes"]),
                        invalid_votes=int(a["invalidVotes"]))
    if c is None:
        raise KeyError(case_id)
    return c


def _addresses_in(e: ChainEvent) -> set[str]:
    """Every address an event names (lists of them included: juries, committees)."""
    out: set[str] = set()
    for v in e.args.values():
        for x in (v if isinstance(v, list | tuple) else (v,)):
            if isinstance(x, str) and len(x) == 42 and x.startswith("0x"):
                out.add(x)
    return out


class ChainIndex:
    """Builds snapshots, one per head block (pages served at one head share it), over a
    :class:`ChainView`; per block, reads only what the block's events touched."""

    def __init__(self, client: ChainClient, home: Path | None = None,
                 min_age_s: float = 1.0) -> None:
        self.c = client
        self.home = home
        self.min_age_s = min_age_s
        self.view = ChainView(client)
        self._feed = EventFeed(self.view)
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._chain_id: int | None = None
        self._addresses: dict[str, str] | None = None
        assert client.deployment is not None  # the view needs one (ConfigError otherwise)
        self._deployed = dict(client.deployment.contracts)
        self._credit_of: list[Bound] = [client.market, client.dispute]
        if "CollabMarket" in self._deployed:
            self._credit_of.append(client.collab)
        self._vs: ViewSnapshot | None = None  # the view's snapshot the last build took in
        self.requests = 0  # HTTP requests of the index's own (node reads), batches once
        self._reset()

    def _reset(self) -> None:
        """Forget every event taken in (first build, or the view's epoch changed)."""
        self._events: dict[tuple[str, int], ChainEvent] = {}  # by (tx hash, log index)
        self._job_events: dict[int, list[ChainEvent]] = {}
        self._dispute_events: dict[int, list[ChainEvent]] = {}
        self._collab_events: dict[int, list[ChainEvent]] = {}
        self._case_events: dict[CaseId, list[ChainEvent]] = {}
        self._rounds: dict[int, list[CollabRound]] = {}
        self._juries: dict[CaseId, JuryCase] = {}
        self._challenger_of: dict[CaseId, str] = {}  # OuterJury case -> its challenger
        self._sub_job_of: dict[int, tuple[int, int, int]] = {}
        self._registered: list[str] = []  # NodeRegistered order
        self._tallies: dict[str, NodeTally] = {}
        self._info: dict[str, NodeInfo] = {}
        self._credits: dict[str, tuple[int, ...]] = {}
        self._nodes: dict[str, NodeRecord] = {}
        # Nodes whose events were taken but whose entry a failed read left unread: read at
        # the next build (the feed does not hand those events out again).
        self._unread: set[str] = set()

    def snapshot(self) -> Snapshot:
        with self._lock:
            s = self._snap
            if s is not None and time.monotonic() - s.taken_at < self.min_age_s:
                return s
            vs = self.view.update()  # the same object while no block arrived
            if s is not None and vs is self._vs:
                return s
            self._snap = self._build()
            return self._snap

    def _build(self) -> Snapshot:
        new = self._feed.take()  # under our lock: nobody else updates the view
        vs = self.view.snapshot
        assert vs is not None
        if self._feed.restarted:  # a reorg: the new epoch's events come again
            self._reset()
        new = [e for e in new if e.key not in self._events]
        self._take(new, vs)
        c = self.c
        if self._chain_id is None:
            self._chain_id = int(c.w3.eth.chain_id)
            self.requests += 1
        if self._addresses is None:
            self._addresses = {"token": str(c.token.address),
                               "registry": str(c.registry.address),
                               "market": str(c.market.address),
                               "dispute": str(c.dispute.address)}
            for name, short in (("CollabMarket", "collab"), ("OuterJury", "outer jury"),
                                ("Availability", "availability")):
                if name in self._deployed:
                    self._addresses[short] = str(self._deployed[name])
        self._vs = vs  # only once built: a failed build is retried at the same head
        return Snapshot(head=vs.block, timestamp=vs.timestamp, chain_id=self._chain_id,
                        addresses=self._addresses, job_count=max(vs.jobs, default=0),
                        jobs=vs.jobs, job_events=dict(self._job_events),
                        disputes=vs.disputes, dispute_events=dict(self._dispute_events),
                        nodes=dict(self._nodes), taken_at=time.monotonic(),
                        collabs=vs.collabs, collab_events=dict(self._collab_events),
                        rounds=dict(self._rounds), juries=dict(self._juries),
                        case_events=dict(self._case_events),
                        sub_job_of=dict(self._sub_job_of))

    def _take(self, events: list[ChainEvent], vs: ViewSnapshot) -> None:
        """Group the new events (copy on write: an older snapshot's lists never change
        under a page being rendered from it), tally them, read the nodes they name."""
        groups: dict[str, dict[Any, list[ChainEvent]]] = {
            "job": {}, "dispute": {}, "collab": {}, "case": {}}
        for e in events:
            self._events[e.key] = e
            a = e.args
            if e.contract == "DisputeGame" and "id" in a:
                groups["dispute"].setdefault(int(a["id"]), []).append(e)
            elif e.contract == "CollabMarket":
                if "jobId" in a:
                    groups["collab"].setdefault(int(a["jobId"]), []).append(e)
                if e.event == "SubJobPosted":
                    self._sub_job_of[int(a["marketJobId"])] = (int(a["jobId"]), int(a["round"]),
                                                              int(a["slot"]))
                elif e.event == "OuterChallenged":
                    self._challenger_of[CaseId(int(a["juryCase"]))] = str(a["challenger"])
            elif e.contract == "OuterJury":
                if "caseId" in a:
                    groups["case"].setdefault(CaseId(int(a["caseId"])), []).append(e)
            elif "jobId" in a:  # the market's, the game's, the availability's
                groups["job"].setdefault(int(a["jobId"]), []).append(e)
            if e.event == "NodeRegistered" and str(a["node"]) not in self._tallies:
                self._registered.append(str(a["node"]))
                self._tallies[str(a["node"])] = NodeTally()
        for kind, into in (("job", self._job_events), ("dispute", self._dispute_events),
                           ("collab", self._collab_events), ("case", self._case_events)):
            for i, evs in groups[kind].items():
                into[i] = [*into.get(i, []), *evs]
        for cid in groups["collab"]:
            self._rounds[cid] = collab_rounds(self._collab_events[cid])
        for case in {*groups["case"], *(k for k in self._challenger_of
                                        if k in self._case_events)}:
            with contextlib.suppress(KeyError):  # a case whose request we have not seen
                self._juries[case] = jury_case(case, self._case_events[case],
                                               self._challenger_of.get(case, ""))
        self._tally(events, vs.jobs)
        self._unread |= {a for e in events for a in _addresses_in(e)} & self._tallies.keys()
        touched = sorted(self._unread)
        self._read_nodes(touched, vs.block)
        self._unread.clear()
        for addr in touched:
            self._nodes[addr] = self._record(addr)
        if touched:  # in the order they registered
            self._nodes = {a: self._nodes[a] for a in self._registered if a in self._nodes}

    def _record(self, a: str) -> NodeRecord:
        t = self._tallies[a]
        market, game, *collab = self._credits[a]
        return NodeRecord(**asdict(t), address=a, info=self._info[a], market_credits=market,
                          game_credits=game, collab_credits=sum(collab))

    def _read_nodes(self, addrs: list[str], block: int) -> None:
        """Registry entry and credits of each node, at ``block``, in batches."""
        calls: list[tuple[Bound, str, tuple[Any, ...]]] = []
        for a in addrs:
            calls.append((self.c.registry, "nodeOf", (a,)))
            calls += [(b, "credits", (a,)) for b in self._credit_of]
        results: list[Any] = []
        for i in range(0, len(calls), BATCH_MAX):
            self.requests += 1
            results += batch_call(self.c.w3, calls[i:i + BATCH_MAX], block)
        it = iter(results)
        for a in addrs:
            self._info[a] = from_struct(NodeInfo, next(it))
            self._credits[a] = tuple(int(next(it)) for _ in self._credit_of)

    def _tally(self, events: list[ChainEvent], jobs: Mapping[JobId, Job]) -> None:
        # The registry's Slashed names no job: the market, game or jury event of the same
        # transaction does (finalize reopening a job, a dispute resolved, a case tallied).
        # A transaction's events all lie in one block, so in one batch of new events.
        cause: dict[str, dict[str, int]] = defaultdict(dict)
        for e in events:
            if e.contract == "DisputeGame" and "id" in e.args:
                cause[e.tx_hash].setdefault("dispute", int(e.args["id"]))
            if e.contract == "OuterJury" and "caseId" in e.args:
                cause[e.tx_hash].setdefault("case", int(e.args["caseId"]))
            if e.contract in ("JobMarket", "DisputeGame", "Availability") and "jobId" in e.args:
                cause[e.tx_hash].setdefault("job", int(e.args["jobId"]))
        tallies = self._tallies
        for e in events:
            a = e.args
            if e.event == "JobFinalized" and str(a["solver"]) in tallies:
                t = tallies[str(a["solver"])]
                t.jobs_solved += 1
                t.rewards += int(a["reward"])
                job = jobs.get(JobId(int(a["jobId"])))
                t.steps_delivered += job.total_steps if job is not None else 0
            elif e.event == "Attested" and str(a["verifier"]) in tallies:
                tallies[str(a["verifier"])].attestations += 1
            elif e.event == "Slashed" and str(a["node"]) in tallies and int(a["amount"]):
                t = tallies[str(a["node"])]
                t.slashed += int(a["amount"])
                t.slashes = [*t.slashes, {
                    "block": e.block_number, "amount": int(a["amount"]),
                    "from": "locked bond or seat" if a["fromLocked"] else "free stake",
                    "job": cause[e.tx_hash].get("job"),
                    "dispute": cause[e.tx_hash].get("dispute"),
                    "case": cause[e.tx_hash].get("case")}]

    # --- the node's own files ----------------------------------------------------------

    def loss_curve(self, job_id: JobId, job: Job) -> LossCurve | None:
        """The committed round's segment losses, if a manifest here has that root."""
        return None if self.home is None else find_loss_curve(self.home, job_id, job)

    def spec_name(self, spec_hash: bytes) -> str:
        """The name in the job's spec, if a node here holds the spec (its artifact id is
        the hash on chain, so the store checked it); "" otherwise."""
        spec = None if self.home is None else find_spec(self.home, spec_hash)
        return "" if spec is None else spec.name
