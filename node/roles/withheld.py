"""A committee member that cannot fetch what its seat must replay (docs/protocol.md,
"Data availability"): it does not attest, and once half the window has passed it names
the first such segment of its share in an availability request; a request the solver
leaves unanswered past its clock it expires, which condemns the round.

Public API::

    await request_withheld(verifier, jid, job, segments)   # at most one request per job
    await expire_requests(verifier, jid)                    # each tick, for our requests
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from node.chain.availability import RequestState
from node.chain.ids import JobId
from node.chain.revert_names import errors
from node.errors import ContractRevert
from node.logs import get_logger
from node.roles.runtime import Runtime
from node.roles.state import RoleState
from node.roles.verifier_machine import VerifierDisk

if TYPE_CHECKING:
    from node.chain.contracts import Job


class Verifier(Protocol):
    """What these moves need of the verifier daemon (node.roles.verifier.Verifier), which
    calls them: a protocol, so this module does not import its caller."""

    rt: Runtime
    state: RoleState[VerifierDisk]

log = get_logger("polnet.verifier.withheld")

# Someone else named it first, it was published meanwhile, or the round moved on.
REQUEST_BENIGN = errors("AlreadyRequested", "AlreadyPublished", "RequestsClosed",
                        "AlreadyCondemned", "NotCommitted")
EXPIRE_BENIGN = errors("NotPending", "NotExpired")


def _deployed(v: Verifier) -> bool:
    dep = v.rt.chain_client.deployment
    return dep is not None and "Availability" in dep.contracts


async def request_withheld(v: Verifier, jid: JobId, job: Job, segments: list[int]) -> None:
    """Request the first of ``segments`` (our share that could not be fetched) unless we
    already hold a request on this job, or the solver still has half its window to serve."""
    rt, c = v.rt, v.rt.chain_client
    rec = v.state.data.jobs[jid]
    if not segments or rec.requests or not _deployed(v):
        return
    window = (await rt.chain(c.market.market_params)).verification_window
    if await rt.chain(c.timestamp) < job.committed_at + window // 2:
        return
    seg = segments[0]
    av = c.availability
    await rt.chain(c.token.ensure_allowance, av.address, (await rt.chain(
        av.availability_params)).bond)
    try:
        rid = await rt.chain(av.request, jid, seg)
    except ContractRevert as exc:  # a benign race is logged, not fatal
        if exc.error in REQUEST_BENIGN:
            log.info("availability_request_not_needed", job=jid, segment=seg, error=str(exc))
            return
        raise
    with v.state as st:
        st.jobs[jid].requests[seg] = rid
    log.info("availability_requested", job=jid, segment=seg, request=rid)


async def expire_requests(v: Verifier, jid: JobId) -> None:
    """Expire our requests on ``jid`` that the solver let run out."""
    rt, c = v.rt, v.rt.chain_client
    rec = v.state.data.jobs.get(jid)
    if rec is None or not rec.requests:
        return
    now = await rt.chain(c.timestamp)
    for seg, rid in list(rec.requests.items()):
        r = await rt.chain(c.availability.get_request, rid)
        if r.state == RequestState.PENDING and now > r.deadline \
                and await rt.transact_ok(c.availability.expire, rid, benign=EXPIRE_BENIGN):
            log.info("availability_expired", job=jid, segment=seg, request=rid)
