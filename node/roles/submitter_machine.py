"""The submitter as a state machine: the jobs it posted (and where a model is to be
fetched to) on disk, and one pure function from (what the chain says, what is on
disk) to the next action. The phase is the job's status in the process's chain view,
decided on each new snapshot: a submitter killed at any point, or one whose job another
party finalized or cancelled, reads the same on the next pass.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from node.chain.contracts import JobStatus
from node.chain.ids import JobId


class SubmitterPhase(enum.StrEnum):
    POSTED = "posted"        # open, claimed or committed: keep serving the inputs
    FINAL = "final"          # finalized: the model can be fetched
    CANCELLED = "cancelled"  # cancelled: the escrow was credited back


class SubmittedJob(BaseModel):
    model_config = ConfigDict(extra="ignore")

    spec: str
    dataset: str
    fetch_to: str | None = None  # a model fetch asked for and maybe not done yet


class SubmitterDisk(BaseModel):
    model_config = ConfigDict(extra="ignore")

    jobs: dict[JobId, SubmittedJob] = Field(default_factory=dict)


@dataclass(frozen=True)
class Serve:
    """Keep serving the spec and dataset: a solver or verifier may still fetch them."""


@dataclass(frozen=True)
class FetchModel:
    out: str


@dataclass(frozen=True)
class Withdraw:
    pass


@dataclass(frozen=True)
class Done:
    pass


Action = Serve | FetchModel | Withdraw | Done


@dataclass(frozen=True)
class SubmitterDecision:
    phase: SubmitterPhase
    action: Action


def decide(status: JobStatus, credits: int, fetch_to: str | None,
           fetched: bool) -> SubmitterDecision:
    """``credits``: ours in the market (refunds, unused budget, slashed bond shares);
    ``fetched``: the model file asked for is on disk."""
    if status in (JobStatus.OPEN, JobStatus.CLAIMED, JobStatus.COMMITTED):
        return SubmitterDecision(SubmitterPhase.POSTED, Serve())
    phase = SubmitterPhase.FINAL if status == JobStatus.FINALIZED else SubmitterPhase.CANCELLED
    if phase == SubmitterPhase.FINAL and fetch_to is not None and not fetched:
        return SubmitterDecision(phase, FetchModel(fetch_to))
    return SubmitterDecision(phase, Withdraw() if credits else Done())
