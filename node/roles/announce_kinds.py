"""Announcement kinds the roles add to the p2p layer's set.

A dispute needs states that are not checkpoints (bisection points, the two
ends of the disputed step). The solver regenerates them, stores them as
artifacts and says which artifact holds which state hash; receivers check the
hash of what they fetch against the chain, so a lying announcement only wastes
a download.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from node.p2p.announce import StrictPayload, register_kind

Bytes32 = Annotated[str, Field(pattern=r"^0x[0-9a-f]{64}$")]
Hex32 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class StateServed(StrictPayload):
    job_id: int = Field(ge=0)
    step: int = Field(ge=0)
    state_hash: Bytes32
    artifact_id: Hex32


register_kind("state_served", StateServed, "polnet/states/1")


class OuterStateServed(StrictPayload):
    """A collaborative job's outer state (theta_r, momentum) for round ``round``, stored
    as an artifact: late joiners and restarted workers start from it instead of
    recomputing every round. Anyone may announce one; the receiver checks its outer
    hash against the one the CollabMarket accepted before using it."""

    collab_job_id: int = Field(ge=1)
    round: int = Field(ge=0)
    outer_hash: Bytes32
    artifact_id: Hex32


register_kind("outer_state", OuterStateServed, "polnet/collab/1")
