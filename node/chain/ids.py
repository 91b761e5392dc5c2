"""Typed ids of the polnet contracts (issue 31): a job, a dispute, a collaborative job
and an outer-jury case are all uint256 on chain, and one passed as another reverts
at best or acts on the wrong object at worst. As ``NewType``s they cost nothing at
run time and mypy refuses a dispute id where a job id is asked for. The contracts
name the same types (``JobId``, ``DisputeId``, ... in contracts/src/interfaces)."""

from __future__ import annotations

from typing import NewType

JobId = NewType("JobId", int)  # JobMarket: 1..jobCount (a collaborative sub-job is one)
DisputeId = NewType("DisputeId", int)  # DisputeGame: 1..disputeCount
CollabId = NewType("CollabId", int)  # CollabMarket: 1..collabCount
CaseId = NewType("CaseId", int)  # OuterJury: 1..caseCount; 0 in a round: no case
