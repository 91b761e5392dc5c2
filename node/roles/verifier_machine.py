"""The verifier as a state machine: what it keeps on disk (its verdicts, the salts
of its votes) and one pure function per thing it tracks (a committed job, a
dispute it plays or judges) from (what the chain says, what is on disk) to the
next action.

Phases are derived from the chain on every pass: whether we attested
(``hasAttested``), whether our vote commitment or reveal is on chain (the
dispute's jury and votes), whether we challenged (a ``DisputeOpened`` naming us,
noted by the event handler), so a SIGKILL between a mined transaction and any
write, or a lost receipt, reads the same on the next pass.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from node.chain.contracts import JobStatus, Phase, Side
from node.chain.ids import DisputeId, JobId
from node.roles.actions import Done, DrawJury, Finalize, Wait, Withdraw
from node.roles.juror_machine import (
    CommitVote,
    JurorView,
    JuryStage,
    ResendVote,
    Resolve,
    RevealVote,
    decide_juror,
)

NO_VOTE = bytes(32)


class VerifierPhase(enum.StrEnum):
    PENDING = "pending"  # some sampled segment not judged yet
    CHECKED = "checked"  # every sampled segment judged: attest or challenge
    DONE = "done"        # the chain has moved on (settled, reopened, another round)


class Role(enum.StrEnum):
    CHALLENGER = "challenger"
    JUROR = "juror"


# --- on disk (a trust boundary: the file may be old, hand-edited or truncated) ----------


class VerifierJob(BaseModel):
    model_config = ConfigDict(extra="ignore")

    round: int | None = None  # the committed round (filled from the chain)
    verdicts: dict[int, bool] = Field(default_factory=dict)  # segment -> passed
    checked: bool = False  # our own work: every sampled segment judged
    attested: bool = False
    not_in_committee: bool = False
    challenged: bool = False
    phase: VerifierPhase = VerifierPhase.PENDING  # the last derivation; never an input
    seen_commit: bool = False  # a ResultCommitted noted since: maybe a new round's
    # segment -> our availability request (node.roles.withheld): what we could not fetch
    requests: dict[int, int] = Field(default_factory=dict)


class VerifierDispute(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Role
    job: JobId | None = None
    round: int | None = None  # the job round it disputes (challenger; from the chain)
    valid: bool | None = None  # our vote, on disk before its commitment is sent
    salt: str | None = None
    over: bool = False  # resolved and nothing left to claim (Resolved is final)


class VerifierDisk(BaseModel):
    model_config = ConfigDict(extra="ignore")

    jobs: dict[JobId, VerifierJob] = Field(default_factory=dict)
    disputes: dict[DisputeId, VerifierDispute] = Field(default_factory=dict)


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """The untyped layout: ``phase`` strings, ``attested = "not in committee"``,
    ``committed``/``revealed`` flags (now read from the chain)."""
    for v in (raw.get("jobs") or {}).values():
        if not isinstance(v, dict):
            continue
        if v.get("phase") == "checked":
            v["checked"] = True
        if v.get("phase") not in {p.value for p in VerifierPhase}:
            v.pop("phase", None)
        if v.get("attested") == "not in committee":
            v["attested"], v["not_in_committee"] = False, True
    for d in (raw.get("disputes") or {}).values():
        if isinstance(d, dict) and d.get("phase") == "over":
            d["over"] = True
    return raw


# --- actions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """Fix the seed if needed, replay the sampled segments (then attest or challenge)."""


@dataclass(frozen=True)
class Attest:
    pass


@dataclass(frozen=True)
class Challenge:
    pass






@dataclass(frozen=True)
class SettleRound:
    """We won a dispute: the round's bond pays once ``finalize`` settles it."""



@dataclass(frozen=True)
class Timeout:
    pass


@dataclass(frozen=True)
class Choose:
    pass


JobAction = Check | Attest | Challenge | Finalize | Withdraw | Wait | Done
DisputeAction = (SettleRound | DrawJury | Timeout | Choose | CommitVote | ResendVote
                 | RevealVote | Resolve | Withdraw | Wait | Done)


# --- jobs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    status: JobStatus
    round: int
    now: int
    window_end: int
    open_disputes: int
    attested: bool = False  # hasAttested(job, us) (read only when it matters)
    credits: int = 0        # ours, read once the job is done


@dataclass(frozen=True)
class JobDisk:
    round: int | None
    checked: bool
    verdicts: dict[int, bool]
    attested: bool
    not_in_committee: bool
    challenged: bool  # on disk, or a dispute of ours on this round
    busy: bool


@dataclass(frozen=True)
class JobDecision:
    phase: VerifierPhase
    action: JobAction


def needs_attest_check(disk: JobDisk) -> bool:
    """Whether ``hasAttested`` must be read: all passed and no record of attesting."""
    return disk.checked and bool(disk.verdicts) and all(disk.verdicts.values()) \
        and not disk.attested and not disk.not_in_committee


def decide_job(chain: JobView, disk: JobDisk) -> JobDecision:
    if chain.status != JobStatus.COMMITTED or chain.round != disk.round:
        return JobDecision(VerifierPhase.DONE, Withdraw() if chain.credits else Done())
    phase = VerifierPhase.CHECKED if disk.checked else VerifierPhase.PENDING
    if chain.now > chain.window_end and chain.open_disputes == 0:
        return JobDecision(phase, Finalize())  # no attest or challenge is taken now
    if disk.busy:
        return JobDecision(phase, Wait())
    if not disk.checked:
        return JobDecision(phase, Check())
    # Challenges stay open while any dispute of the round is live.
    if any(not ok for ok in disk.verdicts.values()):
        return JobDecision(phase, Wait() if disk.challenged else Challenge())
    if needs_attest_check(disk) and not chain.attested:
        return JobDecision(phase, Attest())
    return JobDecision(phase, Wait())


# --- disputes --------------------------------------------------------------------------


@dataclass(frozen=True)
class DisputeView:
    phase: Phase
    turn: Side
    solver_clock_left: int
    now: int
    block: int
    draw_block: int
    reveal_end: int
    won: bool                 # the challenger won (invalid, or the solver timed out)
    my_commitment: bytes | None  # our vote commitment on chain (None: no seat)
    my_revealed: bool
    round_settled: bool = True  # the disputed round's bond settled (read when we won)
    credits: int = 0            # ours, read once resolved


def decide_dispute(d: DisputeView, disk: VerifierDispute) -> DisputeAction:
    juror = disk.role == Role.JUROR
    if d.phase == Phase.RESOLVED:
        if d.won and disk.role == Role.CHALLENGER and not d.round_settled:
            return SettleRound()
        return Withdraw() if d.credits else Done()
    if d.phase == Phase.DRAWING:
        return DrawJury() if d.block > d.draw_block else Wait()
    if d.phase == Phase.BISECTION:
        if d.turn == Side.SOLVER and d.solver_clock_left == 0:
            return Timeout()
        if d.turn == Side.CHALLENGER and disk.role == Role.CHALLENGER:
            return Choose()
        return Wait()
    # The jury: the one juror machine both juries share (node.roles.juror_machine).
    stage = (JuryStage.COMMIT if d.phase == Phase.COMMIT
             else JuryStage.OTHER if d.phase != Phase.REVEAL
             else JuryStage.OVER if d.now > d.reveal_end else JuryStage.REVEAL)
    return decide_juror(JurorView(
        stage, seated=juror and d.my_commitment is not None, saved=disk.salt is not None,
        committed=d.my_commitment not in (None, NO_VOTE), revealed=d.my_revealed))
