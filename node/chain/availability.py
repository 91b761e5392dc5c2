"""Facade over the Availability contract: data-availability requests on committed rounds.

A requester names a segment; the solver must put its two leaves (with proofs against the
committed root) on chain before the answer clock runs out, or the round is condemned.
See contracts/src/interfaces/IAvailability.sol and docs/protocol.md ("Data availability").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from eth_typing import ChecksumAddress
from web3.types import TxReceipt

from node.chain.bound import Bound
from node.chain.contracts import from_struct
from node.chain.ids import JobId
from node.proof import TraceLeaf


class RequestState(enum.IntEnum):
    """IAvailability.State."""

    NONE = 0
    PENDING = 1
    ANSWERED = 2
    LOST = 3  # unanswered: the round was condemned


@dataclass(frozen=True)
class AvailabilityRequest:
    """IAvailability.Request."""

    job_id: JobId
    round: int
    segment: int
    challenger: ChecksumAddress
    deadline: int
    state: RequestState

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", RequestState(self.state))


@dataclass(frozen=True)
class AvailabilityParamsView:
    bond: int
    answer_window: int
    solver_share_bps: int


def leaf_arg(leaf: TraceLeaf, proof: list[bytes]) -> tuple[Any, ...]:
    """An ``IAvailability.Leaf`` tuple."""
    return (leaf.state_hash, leaf.loss_e9, proof)


class Availability(Bound):
    def request(self, job_id: JobId, segment: int) -> int:
        """Name ``segment`` of the job's round (approve ``bond`` for this contract first);
        returns the request id."""
        r = self.transact("request", job_id, segment)
        return int(self.event_arg(r, "Requested", "requestId"))

    def publish(self, job_id: JobId, segment: int, start: TraceLeaf, start_proof: list[bytes],
                end: TraceLeaf, end_proof: list[bytes]) -> TxReceipt:
        """Put leaves ``segment`` and ``segment + 1`` on chain (answers a pending request)."""
        return self.transact("publish", job_id, segment, leaf_arg(start, start_proof),
                             leaf_arg(end, end_proof))

    def expire(self, request_id: int) -> TxReceipt:
        return self.transact("expire", request_id)

    def evidenced(self, job_id: JobId, round_: int) -> bool:
        return bool(self.call("evidenced", job_id, round_))

    def is_published(self, job_id: JobId, round_: int, segment: int) -> bool:
        return bool(self.call("isPublished", job_id, round_, segment))

    def pending_of(self, job_id: JobId, round_: int, segment: int) -> int:
        return int(self.call("pendingOf", job_id, round_, segment))

    def get_request(self, request_id: int) -> AvailabilityRequest:
        return from_struct(AvailabilityRequest, self.call("getRequest", request_id))

    def request_count(self) -> int:
        return int(self.call("requestCount"))

    def availability_params(self) -> AvailabilityParamsView:
        return from_struct(AvailabilityParamsView, self.call("params"))

    def total_owed(self) -> int:
        return int(self.call("totalOwed"))
