"""Typed facades over the polnet contracts, for the daemons.

Each method is one line over :class:`Bound` (which generates calls from the
ABI); they exist to give the solver, verifier and submitter signatures to code
against. Anything not wrapped here is still reachable as ``facade.fnName(...)``.
Structs come back as frozen dataclasses with snake_case fields.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from eth_abi import encode as abi_encode
from eth_typing import ChecksumAddress
from eth_utils import keccak
from web3.types import TxReceipt

from node.chain.bound import Bound
from node.chain.ids import CaseId, CollabId, DisputeId, JobId
from node.chain.rpc import rpc_guard
from node.errors import ChainError
from node.proof import TraceLeaf

T = TypeVar("T")

SOLVER = 1
VERIFIER = 2


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def from_struct(cls: type[T], value: Any) -> T:
    """Build dataclass ``cls`` from a decoded struct (named tuple), by field name."""
    raw = value._asdict() if hasattr(value, "_asdict") else dict(value)
    by_snake = {_snake(k): v for k, v in raw.items()}
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: (bytes(v) if isinstance(v, bytes) else v)
                  for k, v in by_snake.items() if k in fields})


# --- token ------------------------------------------------------------------------------


class Token(Bound):
    def balance_of(self, who: str) -> int:
        return int(self.call("balanceOf", who))

    def allowance(self, owner: str, spender: str) -> int:
        return int(self.call("allowance", owner, spender))

    def approve(self, spender: str, amount: int) -> TxReceipt:
        return self.transact("approve", spender, amount)

    def transfer(self, to: str, amount: int) -> TxReceipt:
        return self.transact("transfer", to, amount)

    def mint_to(self, to: str, amount: int) -> TxReceipt:
        """Owner only (the devnet deployer)."""
        return self.transact("mint", to, amount)

    def ensure_allowance(self, spender: str, amount: int) -> TxReceipt | None:
        """Approve ``amount`` for ``spender`` unless already allowed."""
        assert self.sender is not None
        if self.allowance(self.sender.address, spender) >= amount:
            return None
        return self.approve(spender, amount)


# --- registry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    registered: bool
    roles: int
    registered_at: int
    unbond_available_at: int
    free_stake: int
    locked_stake: int
    unbonding_stake: int
    changed_at: int
    peer_id: str
    multiaddrs: list[str]
    profile: str
    seat_locked_stake: int = 0  # juror / attestor seats' slashable stake, out of free


class Registry(Bound):
    def register(self, roles: int, peer_id: str, multiaddrs: list[str],
                 profile: str = "{}") -> TxReceipt:
        return self.transact("register", roles, peer_id, multiaddrs, profile)

    def update_node(self, roles: int, peer_id: str, multiaddrs: list[str],
                    profile: str = "{}") -> TxReceipt:
        return self.transact("updateNode", roles, peer_id, multiaddrs, profile)

    def stake(self, amount: int) -> TxReceipt:
        """Needs ``token.approve(registry, amount)`` first (see :meth:`ChainClient.stake`)."""
        return self.transact("stake", amount)

    def request_unbond(self, amount: int) -> TxReceipt:
        return self.transact("requestUnbond", amount)

    def withdraw_unbonded(self) -> TxReceipt:
        return self.transact("withdrawUnbonded")

    def node_of(self, who: str) -> NodeInfo:
        return from_struct(NodeInfo, self.call("nodeOf", who))

    def free_stake(self, who: str) -> int:
        return int(self.call("freeStake", who))

    def locked_stake(self, who: str) -> int:
        return int(self.call("lockedStake", who))

    def seat_locked_stake(self, who: str) -> int:
        """What the node's juror / attestor seats would lose to a slash, held until they end."""
        return int(self.call("seatLockedStake", who))

    def is_solver(self, who: str) -> bool:
        return bool(self.call("isSolver", who))

    def is_verifier(self, who: str) -> bool:
        return bool(self.call("isVerifier", who))

    def total_owed(self) -> int:
        return int(self.call("totalOwed"))

    def verifiers(self) -> list[ChecksumAddress]:
        """The sortition pool (append-only; an entry weighs 0 while not a verifier)."""
        return [self.call("verifierAt", i) for i in range(int(self.call("verifierCount")))]

    def sortition(self, seed: bytes, want: int, pool_len: int, snapshot_block: int,
                  exclude: list[str]) -> list[ChecksumAddress]:
        return list(self.call("sortition", seed, want, pool_len, snapshot_block, exclude))

    def weights_at(self, pool_len: int, snapshot_block: int) -> list[int]:
        """Each pool entry's draw weight as of ``snapshot_block`` (0: never drawn then)."""
        return [int(w) for w in self.call("weightsAt", pool_len, snapshot_block)]


# --- market -----------------------------------------------------------------------------


class Verdict(enum.IntEnum):
    """How a dispute ended (IJobMarket.Verdict)."""

    NONE = 0
    VALID = 1
    INVALID = 2
    SOLVER_TIMED_OUT = 3
    VOID = 4


class JobStatus(enum.IntEnum):
    OPEN = 0
    CLAIMED = 1
    COMMITTED = 2
    FINALIZED = 3
    CANCELLED = 4


@dataclass(frozen=True)
class Job:
    status: JobStatus
    submitter: ChecksumAddress
    solver: ChecksumAddress
    spec_hash: bytes
    dataset_hash: bytes
    reward: int
    verification_budget: int
    bond: int
    solve_duration: int
    posted_at: int
    deadline: int
    committed_at: int
    window_end: int
    trace_root: bytes
    final_state_hash: bytes
    segment_count: int
    steps_per_segment: int
    sample_block: int
    seed: bytes
    open_disputes: int
    round: int
    attestations: int
    total_steps: int
    init_state_hash: bytes
    snapshot_block: int
    pool_len: int
    sample_count: int = 0  # n: segments sampled (0 for a reserved job: its own rule)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", JobStatus(self.status))


@dataclass(frozen=True)
class JobTerms:
    """What ``postJob`` fixes: the commitment must be this job's."""

    spec_hash: bytes
    dataset_hash: bytes
    reward: int
    verification_budget: int
    solve_duration: int
    total_steps: int
    steps_per_segment: int
    init_state_hash: bytes
    # n: 0 takes the market's floor min(sample_count, S); more (up to S) buys assurance,
    # and the market escrows verification_budget * n / floor (node.incentives.priced_budget)
    sample_count: int = 0

    def as_tuple(self) -> tuple[Any, ...]:
        return dataclasses.astuple(self)


@dataclass(frozen=True)
class RoundInfo:
    condemned: bool
    sampled_invalid: bool
    settled: bool
    jury_wins: int
    timeout_wins: int
    first_winner: DisputeId  # the earliest-opened dispute the solver lost: the one finalize pays
    # (what it paid is in the RoundSettled / RewardPaid events, not stored)
    liable_seats: int  # bit i: committee seat i's share held an invalid segment (slashed)


@dataclass(frozen=True)
class DisputeRef:
    job_id: JobId
    segment: int
    challenger: ChecksumAddress
    round: int
    settled: bool
    verdict: Verdict

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", Verdict(self.verdict))


@dataclass(frozen=True)
class MarketParamsView:
    bond_factor_bps: int
    verification_window: int
    sample_lookahead: int
    sample_count: int
    reserved_sample_count: int
    missed_deadline_slash_bps: int
    challenge_bond: int
    attestor_slash_bps: int
    attestors_per_job: int
    dispute_grace: int
    challenger_share_bps: int
    juror_share_bps: int
    submitter_share_bps: int


ZERO32 = bytes(32)


class Market(Bound):
    # submitter
    def post_job(self, terms: JobTerms) -> JobId:
        """Escrows reward + budget (approve the market first); returns the job id."""
        r = self.transact("postJob", terms.as_tuple())
        return JobId(int(self.event_arg(r, "JobPosted", "jobId")))

    def post_reserved_job(self, terms: JobTerms, solver: str) -> JobId:
        """Like :meth:`post_job`, but only ``solver`` may claim it and only the caller
        (its submitter) may finalize, reclaim or cancel it; returns the job id."""
        r = self.transact("postReservedJob", terms.as_tuple(), solver)
        return JobId(int(self.event_arg(r, "JobPosted", "jobId")))

    def reserved_solver_of(self, job_id: JobId) -> ChecksumAddress:
        """The only solver that may claim ``job_id``; the zero address for an ordinary job."""
        return self.call("reservedSolverOf", job_id)  # type: ignore[no-any-return]

    def cancel(self, job_id: JobId) -> TxReceipt:
        return self.transact("cancel", job_id)

    # solver
    def claim_job(self, job_id: JobId) -> TxReceipt:
        return self.transact("claimJob", job_id)

    def commit_result(self, job_id: JobId, trace_root: bytes, final: TraceLeaf,
                      init_proof: list[bytes], final_proof: list[bytes]) -> TxReceipt:
        """Commit with proofs that leaf 0 is the job's S_0 and the last leaf is ``final``."""
        return self.transact("commitResult", job_id, trace_root, final.state_hash,
                             final.loss_e9, init_proof, final_proof)

    def commit_trace(self, job_id: JobId, leaves: list[TraceLeaf], tree: Any) -> TxReceipt:
        """:meth:`commit_result` from a whole trace (``node.proof.MerkleTree``)."""
        return self.commit_result(job_id, tree.root, leaves[-1], tree.proof(0),
                                  tree.proof(len(leaves) - 1))

    # anyone
    def fix_seed(self, job_id: JobId) -> bytes:
        """The fixed seed, or 32 zero bytes if the sampling block was re-armed."""
        r = self.transact("fixSeed", job_id)
        fixed = self.events(r, "SeedFixed")
        return bytes(fixed[0]["args"]["seed"]) if fixed else ZERO32

    def finalize(self, job_id: JobId) -> TxReceipt:
        """Pays a clean round, or settles a condemned one (bond split, job reopened)."""
        return self.transact("finalize", job_id)

    def reclaim(self, job_id: JobId) -> TxReceipt:
        return self.transact("reclaim", job_id)

    def withdraw(self) -> int:
        """Pays out the caller's credit; returns the amount."""
        return int(self.event_arg(self.transact("withdraw"), "Withdrawn", "amount"))

    # verifier
    def attest(self, job_id: JobId) -> TxReceipt:
        """Committee member: every sampled segment replayed within tolerance."""
        return self.transact("attest", job_id)

    def challenge(self, job_id: JobId, segment: int, start: TraceLeaf, start_proof: list[bytes],
                  end: TraceLeaf, end_proof: list[bytes]) -> DisputeId:
        """Dispute ``segment`` with its two committed leaves and their proofs
        (``node.proof.MerkleTree.proof``); returns the dispute id."""
        r = self.transact("challenge", job_id, segment, start.state_hash, start.loss_e9,
                          start_proof, end.state_hash, end.loss_e9, end_proof)
        return DisputeId(int(self.event_arg(r, "Challenged", "disputeId")))

    def committee_of(self, job_id: JobId) -> list[ChecksumAddress]:
        return list(self.call("committeeOf", job_id))

    def attestors_of(self, job_id: JobId) -> list[ChecksumAddress]:
        return list(self.call("attestorsOf", job_id))

    def has_attested(self, job_id: JobId, who: str) -> bool:
        return bool(self.call("hasAttested", job_id, who))

    def is_barred(self, job_id: JobId, segment: int, who: str) -> bool:
        return bool(self.call("isBarred", job_id, segment, who))

    def round_info(self, job_id: JobId, round_: int) -> RoundInfo:
        return from_struct(RoundInfo, self.call("roundInfo", job_id, round_))

    def dispute_ref(self, dispute_id: DisputeId) -> DisputeRef:
        return from_struct(DisputeRef, self.call("disputeRef", dispute_id))

    # views
    def get_job(self, job_id: JobId) -> Job:
        return from_struct(Job, self.call("getJob", job_id))

    def job_count(self) -> int:
        return int(self.call("jobCount"))

    def credits(self, who: str) -> int:
        return int(self.call("credits", who))

    def total_burned(self) -> int:
        """Attestor slashes burned, ever (the dispute game's burns are its own)."""
        return int(self.call("totalBurned"))

    def seed_of(self, job_id: JobId) -> bytes:
        return bytes(self.call("seedOf", job_id))

    def sampled_segments(self, job_id: JobId) -> list[int]:
        return [int(s) for s in self.call("sampledSegments", job_id)]

    def market_params(self) -> MarketParamsView:
        return from_struct(MarketParamsView, self.call("params"))

    def total_owed(self) -> int:
        return int(self.call("totalOwed"))


# --- dispute game -----------------------------------------------------------------------


class Phase(enum.IntEnum):
    NONE = 0
    BISECTION = 1
    DRAWING = 2  # waiting for the block whose hash seeds the jury
    COMMIT = 3
    REVEAL = 4
    RESOLVED = 5


class Side(enum.IntEnum):
    SOLVER = 0
    CHALLENGER = 1


@dataclass(frozen=True)
class Vote:
    commitment: bytes
    revealed: bool
    valid: bool


@dataclass(frozen=True)
class DisputeState:
    """``getDispute``: the stored game with phase and clocks as of now."""

    id: DisputeId
    job_id: JobId
    segment: int
    solver: ChecksumAddress
    challenger: ChecksumAddress
    challenge_bond: int
    start_step: int
    end_step: int
    lo: int
    hi: int
    lo_hash: bytes  # not stored by the game: from the newest RangeNarrowed / DisputeOpened
    hi_hash: bytes
    range_root: bytes  # solver to move: keccak256(abi.encode(lo_hash, hi_hash)) (else zero)
    mids_root: bytes  # challenger to move: mids_commitment of the pending mids (else zero)
    phase: Phase  # as of now (Reveal once the commit window is over)
    turn: Side
    solver_clock_left: int
    challenger_clock_left: int
    rounds: int
    jury_seed: bytes  # zero: the contract keeps the seed in JuryDrawn only
    commit_end: int
    reveal_end: int
    valid_votes: int
    invalid_votes: int
    solver_won: bool
    verdict: Verdict
    draw_block: int  # while DRAWING: block whose hash seeds the jury
    jury: list[ChecksumAddress]
    votes: list[Vote]
    mid_steps: list[int]  # p_1..p_{parts-1} of [lo, hi] while bisecting

    @property
    def points(self) -> list[int]:
        """lo, the mid steps, hi: part j of this round is [points[j], points[j + 1]]."""
        return [self.lo, *self.mid_steps, self.hi]

    @property
    def next_move(self) -> str:
        """Who acts now, in words (``turn`` only means something while bisecting)."""
        if self.phase == Phase.BISECTION:
            return f"{self.turn.name.lower()} (bisection)"
        return {Phase.DRAWING: "anyone: drawJury once the seed block is mined",
                Phase.COMMIT: "jurors: commit votes", Phase.REVEAL: "jurors: reveal votes",
                Phase.RESOLVED: "nobody: resolved"}.get(self.phase, "-")


def range_root(lo_hash: bytes, hi_hash: bytes) -> bytes:
    """``keccak256(abi.encode(loHash, hiHash))``: what the game stores for a range."""
    return keccak(lo_hash + hi_hash)


def mids_commitment(lo_hash: bytes, hi_hash: bytes, hashes: list[bytes]) -> bytes:
    """``keccak256(abi.encode(rangeRoot, keccak256(abi.encodePacked(hashes))))``: what
    ``postMids`` stores (the dispute's ``mids_root`` while the challenger is to move)."""
    return keccak(range_root(lo_hash, hi_hash) + keccak(b"".join(hashes)))


def vote_commitment(dispute_id: DisputeId, juror: str, valid: bool, salt: bytes) -> bytes:
    """``keccak256(abi.encode(id, juror, valid, salt))``, what ``commitVote`` takes."""
    return keccak(abi_encode(["uint256", "address", "bool", "bytes32"],
                             [dispute_id, juror, valid, salt]))


def dispute_state(dispute_id: DisputeId, view: Any, hashes: tuple[bytes, bytes]) -> DisputeState:
    """A decoded ``getDispute`` and the range's end hashes (which the game does not
    store: :meth:`Dispute.range_hashes`, or the chain view's events) as a DisputeState."""
    raw = {_snake(k): v for k, v in view.dispute._asdict().items()}
    raw.update(id=dispute_id, phase=Phase(view.phase), turn=Side(raw["turn"]),
               solver_clock_left=int(view.solverClockLeft),
               challenger_clock_left=int(view.challengerClockLeft),
               votes=[from_struct(Vote, v) for v in view.votes],
               verdict=Verdict(raw["verdict"]))
    for k in ("range_root", "mids_root", "jury_seed"):
        raw[k] = bytes(raw[k])
    raw["lo_hash"], raw["hi_hash"] = hashes
    raw["mid_steps"] = [int(x) for x in raw["mid_steps"]]
    known = {f.name for f in dataclasses.fields(DisputeState)}
    return DisputeState(**{k: v for k, v in raw.items() if k in known})


class Dispute(Bound):
    # bisection
    def post_mids(self, dispute_id: DisputeId, hashes: list[bytes]) -> TxReceipt:
        """Solver: the state hashes after the dispute's ``mid_steps``, in order."""
        return self.transact("postMids", dispute_id, hashes)

    def choose(self, dispute_id: DisputeId, part: int, hashes: list[bytes]) -> TxReceipt:
        """Challenger: dispute part ``part`` ([points[part], points[part + 1]]);
        ``hashes`` are the solver's posted mids (:meth:`posted_mids`). The range's end
        states, which the game checks but does not store, come from its logs."""
        lo_hash, hi_hash = self.range_hashes(dispute_id)
        return self.transact("choose", dispute_id, part, hashes, lo_hash, hi_hash)

    def _newest_log(self, event: Any, dispute_id: DisputeId, earliest: int = 0,
                    window: int = 5_000) -> Any:
        """The newest ``event`` log of the dispute (None if none), searched backwards from
        the head in ``window``-block ranges down to block ``earliest``."""
        with rpc_guard(self._url):
            hi = int(self.w3.eth.block_number)
        while hi >= earliest:
            lo = max(earliest, hi - window + 1)
            with rpc_guard(self._url):
                logs = list(event.get_logs(argument_filters={"id": dispute_id},
                                           from_block=lo, to_block=hi))
            if logs:
                return logs[-1]
            hi = lo - 1
        return None

    def range_hashes(self, dispute_id: DisputeId) -> tuple[bytes, bytes]:
        """The states at the dispute's current lo and hi: the newest ``RangeNarrowed``,
        or ``DisputeOpened`` before any (zeros for an unknown dispute)."""
        log = self._newest_log(self.contract.events.RangeNarrowed, dispute_id)
        if log is not None:
            return bytes(log["args"]["loHash"]), bytes(log["args"]["hiHash"])
        log = self._newest_log(self.contract.events.DisputeOpened, dispute_id)
        if log is not None:
            return bytes(log["args"]["startHash"]), bytes(log["args"]["endHash"])
        return ZERO32, ZERO32

    def posted_mids(self, dispute_id: DisputeId, root: bytes, earliest: int = 0,
                    window: int = 5_000) -> list[bytes]:
        """The mid hashes behind ``root`` (the dispute's pending ``mids_root``), from
        the newest ``MidsPosted`` log of the dispute: searched backwards from the head
        in ``window``-block ranges down to block ``earliest``."""
        lo_hash, hi_hash = self.range_hashes(dispute_id)
        event = self.contract.events.MidsPosted
        with rpc_guard(self._url):
            hi = int(self.w3.eth.block_number)
        while hi >= earliest:
            lo = max(earliest, hi - window + 1)
            with rpc_guard(self._url):
                logs = list(event.get_logs(argument_filters={"id": dispute_id},
                                           from_block=lo, to_block=hi))
            for log in reversed(logs):
                hashes = [bytes(h) for h in log["args"]["hashes"]]
                if mids_commitment(lo_hash, hi_hash, hashes) == root:
                    return hashes
            hi = lo - 1
        raise ChainError(f"dispute {dispute_id}: no MidsPosted log matches mids root "
                         f"0x{root.hex()} (searched blocks {earliest}..head)")

    def timeout(self, dispute_id: DisputeId) -> TxReceipt:
        return self.transact("timeout", dispute_id)

    # jury
    def commit_vote(self, dispute_id: DisputeId, valid: bool, salt: bytes) -> TxReceipt:
        assert self.sender is not None
        return self.transact("commitVote", dispute_id,
                             vote_commitment(dispute_id, self.sender.address, valid, salt))

    def reveal_vote(self, dispute_id: DisputeId, valid: bool, salt: bytes) -> TxReceipt:
        return self.transact("revealVote", dispute_id, valid, salt)

    def resolve(self, dispute_id: DisputeId) -> TxReceipt:
        return self.transact("resolve", dispute_id)

    def draw_jury(self, dispute_id: DisputeId) -> TxReceipt:
        """Anyone, once ``draw_block`` is mined: draw the jury from its hash."""
        return self.transact("drawJury", dispute_id)

    def total_burned(self) -> int:
        return int(self.call("totalBurned"))

    def settle_delay(self, job_id: JobId, round_: int) -> TxReceipt:
        """Anyone, once the round settled: its held delay compensation to its solver (the
        round was paid) or to the burn address (condemned)."""
        return self.transact("settleDelay", job_id, round_)

    def delay_held(self, job_id: JobId, round_: int) -> int:
        return int(self.call("delayHeld", job_id, round_))

    def total_delay_held(self) -> int:
        return int(self.call("totalDelayHeld"))

    def withdraw(self) -> int:
        return int(self.event_arg(self.transact("withdraw"), "Withdrawn", "amount"))

    # views
    def get_dispute(self, dispute_id: DisputeId) -> DisputeState:
        return dispute_state(dispute_id, self.call("getDispute", dispute_id),
                             self.range_hashes(dispute_id))

    def is_juror(self, dispute_id: DisputeId, who: str) -> bool:
        return bool(self.call("isJuror", dispute_id, who))

    def credits(self, who: str) -> int:
        return int(self.call("credits", who))

    def total_owed(self) -> int:
        return int(self.call("totalOwed"))


# --- collaborative jobs -------------------------------------------------------------------


class CollabStatus(enum.IntEnum):
    NONE = 0
    OPEN = 1
    RUNNING = 2
    FINISHED = 3
    FAILED = 4


class RoundPhase(enum.IntEnum):
    IDLE = 0
    RUNNING = 1
    OUTER = 2  # settled with >= minWorkers accepted: waiting for its outer state


class ChallengePhase(enum.IntEnum):
    NONE = 0
    LIVE = 1  # its OuterJury case (``jury_case``) is not resolved yet


class JuryPhase(enum.IntEnum):
    """IOuterJury.Phase."""

    NONE = 0
    DRAWING = 1
    VOTING = 2
    TALLIED = 3


class OuterVerdict(enum.IntEnum):
    NONE = 0
    VALID = 1
    INVALID = 2
    VOID = 3


@dataclass(frozen=True)
class CollabTerms:
    """What ``postCollabJob`` fixes (ICollabMarket.CollabTerms)."""

    spec_hash: bytes
    dataset_hash: bytes
    reward: int
    verification_budget: int
    min_workers: int
    max_workers: int
    inner_steps: int
    steps_per_segment: int
    rounds: int
    round_duration: int
    init_state_hash: bytes
    outer_init_hash: bytes
    pipeline_depth: int = 0  # D <= 4: rounds that may run ahead of the last finalized one

    def as_tuple(self) -> tuple[Any, ...]:
        return dataclasses.astuple(self)


@dataclass(frozen=True)
class CollabJob:
    status: CollabStatus
    phase: RoundPhase
    submitter: ChecksumAddress
    spec_hash: bytes
    dataset_hash: bytes
    reward: int
    verification_budget: int
    sub_reward: int
    sub_budget: int
    pool: int
    min_workers: int
    max_workers: int
    inner_steps: int
    steps_per_segment: int
    rounds: int
    round_duration: int
    round: int
    retries: int
    init_state_hash: bytes
    outer_hash: bytes
    pipeline_depth: int = 0  # D
    ahead: int = 0  # speculative rounds running past ``round`` (<= D)

    @property
    def pipeline_bond(self) -> int:
        """P: on top of every slot bond and outer bond of a pipelined job."""
        return self.pipeline_depth * self.max_workers * self.sub_reward

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", CollabStatus(self.status))
        object.__setattr__(self, "phase", RoundPhase(self.phase))


@dataclass(frozen=True)
class CollabRound:
    start: int
    deadline: int
    attempt: int
    sub_jobs: list[JobId]  # market job id per slot, 0 where the slot had none
    accepted_mask: int
    settled: bool
    outer_hash: bytes
    next_init_hash: bytes
    poster: ChecksumAddress
    posted_at: int
    window_end: int
    accepted: bool
    challenge_phase: ChallengePhase
    challenger: ChecksumAddress
    jury_case: CaseId  # OuterJury case of the live (or last) challenge; 0 if none
    last_verdict: OuterVerdict

    def __post_init__(self) -> None:
        object.__setattr__(self, "challenge_phase", ChallengePhase(self.challenge_phase))
        object.__setattr__(self, "last_verdict", OuterVerdict(self.last_verdict))
        object.__setattr__(self, "sub_jobs", [JobId(int(x)) for x in self.sub_jobs])

    def accepted_slots(self) -> list[int]:
        return [i for i in range(len(self.sub_jobs)) if self.accepted_mask >> i & 1]


@dataclass(frozen=True)
class SubJobRef:
    collab_job_id: CollabId  # 0: not a collaborative inner run
    round: int
    slot: int


@dataclass(frozen=True)
class CollabParamsView:
    outer_window: int
    outer_bond: int
    max_slots: int
    max_rounds: int
    max_round_retries: int
    throughput_tolerance_bps: int
    slot_bond: int


def outer_vote_commitment(valid: bool, salt: bytes, juror: str, case_id: CaseId) -> bytes:
    """``keccak256(abi.encode(valid, salt, juror, caseId))``, what
    ``OuterJury.commitVote`` takes."""
    return keccak(abi_encode(["bool", "bytes32", "address", "uint256"],
                             [valid, salt, juror, case_id]))


@dataclass(frozen=True)
class JuryCase:
    """IOuterJury.Case: one challenge of a posted outer state."""

    job_id: CollabId
    round: int
    phase: JuryPhase
    poster: ChecksumAddress
    challenger: ChecksumAddress
    request_block: int
    pool_len: int
    commit_end: int
    reveal_end: int
    jury: list[ChecksumAddress]

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", JuryPhase(self.phase))
        object.__setattr__(self, "jury", list(self.jury))


@dataclass(frozen=True)
class OuterJuryParamsView:
    jury_lookahead: int
    jury_size: int
    quorum: int
    commit_window: int
    reveal_window: int
    juror_slash: int


class OuterJury(Bound):
    """OuterJury: draws, votes and tallies the juries over challenged outer states (the
    CollabMarket opens and tallies cases; jurors commit and reveal here)."""

    def draw(self, case_id: CaseId) -> TxReceipt:
        return self.transact("draw", case_id)

    def commit_vote(self, case_id: CaseId, valid: bool, salt: bytes) -> TxReceipt:
        assert self.sender is not None
        return self.transact("commitVote", case_id,
                             outer_vote_commitment(valid, salt, self.sender.address, case_id))

    def reveal_vote(self, case_id: CaseId, valid: bool, salt: bytes) -> TxReceipt:
        return self.transact("revealVote", case_id, valid, salt)

    def get_case(self, case_id: CaseId) -> JuryCase:
        return from_struct(JuryCase, self.call("getCase", case_id))

    def vote_of(self, case_id: CaseId, juror: str) -> int:
        """0 none, 1 committed, 2 revealed valid, 3 revealed invalid."""
        return int(self.call("voteOf", case_id, juror))

    def jury_params(self) -> OuterJuryParamsView:
        return from_struct(OuterJuryParamsView, self.call("params"))

    def case_count(self) -> int:
        return int(self.call("caseCount"))


class Collab(Bound):
    """CollabMarket: collaborative jobs whose inner runs are reserved JobMarket jobs."""

    # submitter
    def post_collab_job(self, terms: CollabTerms) -> CollabId:
        """Escrows reward + budget (approve the CollabMarket first); returns the job id."""
        r = self.transact("postCollabJob", terms.as_tuple())
        return CollabId(int(self.event_arg(r, "CollabPosted", "jobId")))

    # workers
    def claim_slot(self, job_id: CollabId, count: int,
                   claimed_milli_steps_per_sec: int) -> list[int]:
        """Take ``count`` free slots (lowest first), each backed by ``slotBond`` tokens, plus
        ``get_collab(job).pipeline_bond`` in a pipelined job (approve ``count`` bonds for the
        CollabMarket first); returns their indices."""
        r = self.transact("claimSlot", job_id, count, claimed_milli_steps_per_sec)
        return [int(e["args"]["slot"]) for e in self.events(r, "SlotClaimed")]

    def leave_slot(self, job_id: CollabId, slot: int) -> TxReceipt:
        return self.transact("leaveSlot", job_id, slot)

    # rounds (anyone)
    def start_round(self, job_id: CollabId) -> TxReceipt:
        """The base round when Idle; in a pipelined job otherwise the next round ahead, from
        its predecessor's posted ``next_init_hash`` (at most ``pipeline_depth`` ahead)."""
        return self.transact("startRound", job_id)

    def settle_round(self, job_id: CollabId) -> TxReceipt:
        return self.transact("settleRound", job_id)

    # outer state (anyone; jurors vote)
    def post_outer(self, job_id: CollabId, round_: int, outer_hash: bytes,
                   next_init_hash: bytes) -> TxReceipt:
        """Needs ``outerBond`` (+ the job's ``pipeline_bond``) approved for the CollabMarket.
        In a pipelined job this also posts a round's candidate: a started, unsettled round
        whose every sub-job is committed, over all of them."""
        return self.transact("postOuter", job_id, round_, outer_hash, next_init_hash)

    def challenge_outer(self, job_id: CollabId, round_: int) -> TxReceipt:
        """Needs ``outerBond`` approved for the CollabMarket. Opens an OuterJury case
        (``get_round(...).jury_case``): the jury is drawn and votes there."""
        return self.transact("challengeOuter", job_id, round_)

    def resolve_outer(self, job_id: CollabId, round_: int) -> TxReceipt:
        return self.transact("resolveOuter", job_id, round_)

    def accept_outer(self, job_id: CollabId, round_: int) -> TxReceipt:
        return self.transact("acceptOuter", job_id, round_)

    def settle_orphan(self, market_job_id: JobId) -> TxReceipt:
        """Settle a sub-job of a rolled-back round through the market (anyone)."""
        return self.transact("settleOrphan", market_job_id)

    def withdraw(self) -> int:
        return int(self.event_arg(self.transact("withdraw"), "Withdrawn", "amount"))

    # views
    def get_collab(self, job_id: CollabId) -> CollabJob:
        return from_struct(CollabJob, self.call("getCollab", job_id))

    def slot_holders(self, job_id: CollabId) -> list[ChecksumAddress]:
        return list(self.call("slotHolders", job_id))

    def get_round(self, job_id: CollabId, round_: int) -> CollabRound:
        return from_struct(CollabRound, self.call("getRound", job_id, round_))

    def sub_job_of(self, market_job_id: JobId) -> SubJobRef:
        c, r, s = self.call("subJobOf", market_job_id)
        return SubJobRef(CollabId(int(c)), int(r), int(s))

    def orphans_of(self, job_id: CollabId) -> int:
        """Sub-jobs of the job's rolled-back rounds not settled yet (``settle_orphan``)."""
        return int(self.call("orphansOf", job_id))

    def is_excluded(self, job_id: CollabId, node: str) -> bool:
        """A sub-job of ``node`` in this job was condemned: it may not take a slot again."""
        return bool(self.call("isExcluded", job_id, node))

    def delivered_of(self, node: str) -> int:
        return int(self.call("deliveredOf", node))

    def claimed_of(self, node: str) -> int:
        return int(self.call("claimedOf", node))

    def collab_params(self) -> CollabParamsView:
        return from_struct(CollabParamsView, self.call("params"))

    def collab_count(self) -> int:
        return int(self.call("collabCount"))

    def credits(self, who: str) -> int:
        return int(self.call("credits", who))

    def total_owed(self) -> int:
        return int(self.call("totalOwed"))
