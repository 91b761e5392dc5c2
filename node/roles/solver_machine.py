"""The solver as a state machine: what it keeps on disk, and one pure function per
thing it tracks (a held job, a candidate, a dispute) from (what the chain says,
what is on disk) to the next action.

Phases are derived from the chain on every pass, never written after a
transaction: a SIGKILL between a mined ``commitResult`` and any write, a lost
receipt, or another party finalizing first all read the same on the next pass.
The recorded ``phase`` is only the last derivation (for metrics and reports).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from node.chain.contracts import JobStatus, Phase, Side
from node.chain.ids import DisputeId, JobId
from node.roles.actions import Done, DrawJury, Finalize, Wait, Withdraw


class SolverPhase(enum.StrEnum):
    TRAINING = "training"      # the chain says we hold it; no trace published yet
    COMMITTING = "committing"  # trace published, the commit not on chain yet
    COMMITTED = "committed"    # our commit is on chain: serve it, answer disputes
    PAID = "paid"              # finalized with us as solver
    LOST = "lost"              # the chain gives it to nobody, or to someone else


ACTIVE = frozenset({SolverPhase.TRAINING, SolverPhase.COMMITTING, SolverPhase.COMMITTED})


# --- on disk (a trust boundary: the file may be old, hand-edited or truncated) ----------


class SolverJob(BaseModel):
    model_config = ConfigDict(extra="ignore")

    round: int
    spec: str
    dataset: str
    phase: SolverPhase = SolverPhase.TRAINING  # the last derivation; never an input
    manifest: str | None = None  # published trace manifest (artifact id)
    root: str | None = None
    final: str | None = None
    keep_every: int = Field(default=1, ge=1)  # sparse trace: every M-th checkpoint kept
    leaves_served: list[int] = Field(default_factory=list)  # regenerated leaves served


class ServedState(BaseModel):
    job_id: JobId
    step: int
    state_hash: str
    artifact_id: str


class SolverDisk(BaseModel):
    model_config = ConfigDict(extra="ignore")

    jobs: dict[JobId, SolverJob] = Field(default_factory=dict)
    candidates: list[JobId] = Field(default_factory=list)
    disputes: list[DisputeId] = Field(default_factory=list)
    served: list[ServedState] = Field(default_factory=list)
    rejected: dict[JobId, str] = Field(default_factory=dict)  # job -> why (never again)
    considering: dict[JobId, int] = Field(default_factory=dict)  # job -> unfinished tries


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """The untyped layout (phase strings, string keys) validates as is, except that
    jobs without their inputs' hashes are dropped: the chain's events bring them back."""
    jobs = raw.get("jobs")
    if isinstance(jobs, dict):
        raw["jobs"] = {k: v for k, v in jobs.items()
                       if isinstance(v, dict) and {"round", "spec", "dataset"} <= v.keys()}
        for v in raw["jobs"].values():
            if v.get("phase") not in {p.value for p in SolverPhase}:
                v.pop("phase", None)
    return raw


# --- views and actions ---------------------------------------------------------------


@dataclass(frozen=True)
class HeldJobView:
    """The chain's side of a job we hold or held."""

    status: JobStatus
    mine: bool  # the chain names us as its solver
    round: int
    now: int
    window_end: int
    open_disputes: int
    credits: int = 0  # ours in the market and the dispute game (read once settled)
    # Segments whose leaves we owe on chain: named by pending availability requests, or
    # the sample once the window is over without an attesting majority (node.roles.evidence).
    owed: tuple[int, ...] = ()


@dataclass(frozen=True)
class HeldJobDisk:
    """What this node has of the job: its own record and files, and running tasks."""

    published: bool  # the trace manifest of the chain's round is published
    has_trace: bool  # a finished trace of the chain's round is on disk
    busy: bool       # a training task for it runs now


@dataclass(frozen=True)
class Train:
    """Train (resuming from the last checkpoint), publish, commit."""


@dataclass(frozen=True)
class Publish:
    """Our commit is on chain but the record of its manifest was lost: publish again."""






@dataclass(frozen=True)
class PublishLeaves:
    """Put these segments' leaves on chain (Availability.publish): an availability request
    names them, or the round is paid on its sample's leaves (no attesting majority)."""

    segments: tuple[int, ...]


@dataclass(frozen=True)
class Adopt:
    """The chain says we hold a job we have no record of (killed after the claim mined,
    or its receipt lost): record it and train it."""


@dataclass(frozen=True)
class Consider:
    """Probe the job and claim it if it fits."""


@dataclass(frozen=True)
class Drop:
    pass



@dataclass(frozen=True)
class PostMids:
    steps: tuple[int, ...]


@dataclass(frozen=True)
class Timeout:
    pass


JobAction = Train | Publish | PublishLeaves | Finalize | Withdraw | Wait | Done
CandidateAction = Adopt | Consider | Drop
DisputeAction = DrawJury | PostMids | Timeout | Withdraw | Wait


@dataclass(frozen=True)
class Decision:
    phase: SolverPhase
    action: JobAction


def decide_job(chain: HeldJobView, disk: HeldJobDisk) -> Decision:
    """A job on our books, whatever the disk last said about it."""
    if chain.mine and chain.status == JobStatus.CLAIMED:
        phase = SolverPhase.COMMITTING if disk.published else SolverPhase.TRAINING
        return Decision(phase, Wait() if disk.busy else Train())
    if chain.mine and chain.status == JobStatus.COMMITTED:
        if not disk.published and disk.has_trace:
            return Decision(SolverPhase.COMMITTED, Publish())
        if chain.owed and disk.has_trace:  # before its clock runs out, or the round is lost
            return Decision(SolverPhase.COMMITTED, PublishLeaves(chain.owed))
        if chain.open_disputes == 0 and chain.now > chain.window_end:
            return Decision(SolverPhase.COMMITTED, Finalize())
        return Decision(SolverPhase.COMMITTED, Wait())
    if chain.mine and chain.status == JobStatus.FINALIZED:
        # Whoever finalized (we, another party, or we before a kill), it paid us.
        return Decision(SolverPhase.PAID, Withdraw() if chain.credits else Done())
    return Decision(SolverPhase.LOST, Done())


def decide_candidate(status: JobStatus, mine: bool, lost_before: bool) -> CandidateAction:
    """A job posted or reopened: ``mine`` when the chain already names us its solver."""
    if mine and status in (JobStatus.CLAIMED, JobStatus.COMMITTED, JobStatus.FINALIZED):
        return Adopt()  # ours on chain whatever the disk says: never leave a bond behind
    if lost_before or status != JobStatus.OPEN:
        return Drop()  # failed once: leave it to others; or not open any more
    return Consider()


@dataclass(frozen=True)
class SolverDisputeView:
    phase: Phase
    turn: Side
    block: int
    draw_block: int
    challenger_clock_left: int
    mid_steps: tuple[int, ...]
    credits: int = 0


def decide_dispute(d: SolverDisputeView, busy: bool) -> DisputeAction | Done:
    """A dispute against one of our commits."""
    if d.phase == Phase.RESOLVED:
        return Withdraw() if d.credits else Done()
    if d.phase == Phase.DRAWING:
        # Anyone may draw; the seed is fixed, so whoever sends it gets the same jury.
        return DrawJury() if d.block > d.draw_block else Wait()
    if d.phase == Phase.BISECTION and d.turn == Side.SOLVER:
        return Wait() if busy else PostMids(d.mid_steps)
    if d.phase == Phase.BISECTION and d.turn == Side.CHALLENGER \
            and d.challenger_clock_left == 0:
        return Timeout()
    return Wait()
