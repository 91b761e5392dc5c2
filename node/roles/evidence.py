"""A solver's side of data availability (docs/protocol.md, "Data availability").

What it owes on chain for a committed round of its own: the leaves of every segment a
pending availability request names (before the request's clock runs out, or the round is
condemned), and, once the window is over with no attesting majority of the committee,
the leaves of every sampled segment (the evidence such a round is paid on). Both are
answered by publishing the two leaves with their Merkle proofs from the trace on disk.

Public API::

    owed_segments(chain_client, jid, job, now, named) -> list[int] # blocking reads
    await publish_segments(solver, jid, segments)                  # one tx per segment
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from node.chain.ids import JobId
from node.errors import ContractRevert
from node.logs import get_logger
from node.roles.runtime import Runtime

if TYPE_CHECKING:
    from node.chain.client import ChainClient
    from node.chain.contracts import Job


class Solver(Protocol):
    """What publishing needs of the solver daemon (node.roles.solver.Solver, which calls
    it): a protocol, so this module does not import its caller."""

    rt: Runtime

    def _trace_dir(self, jid: JobId) -> Path: ...

log = get_logger("polnet.solver.evidence")

# A publication another party (or our own lost receipt) made first is no failure.
PUBLISH_BENIGN = ("AlreadyPublished",)


def requested_segments(c: ChainClient, jid: JobId, job: Job) -> list[int]:
    """Segments of the job's current round named by a still-pending availability request."""
    av = c.availability
    logs = av.contract.events.Requested().get_logs(
        from_block=job.snapshot_block, argument_filters={"jobId": jid})
    segs = {int(e["args"]["segment"]) for e in logs if int(e["args"]["round"]) == job.round}
    return sorted(s for s in segs if av.pending_of(jid, job.round, s) != 0)


def owed_segments(c: ChainClient, jid: JobId, job: Job, now: int,
                  named: set[int] | None = None) -> list[int]:
    """What we must publish now for our committed job ``jid`` (blocking chain reads).
    ``named``: the segments availability requests of the round named, as the caller
    knows them from events (None: searched in the logs here)."""
    if "Availability" not in (c.deployment.contracts if c.deployment else {}):
        return []
    m, av = c.market, c.availability
    if named is None:
        owed = set(requested_segments(c, jid, job))
    else:
        owed = {s for s in named if av.pending_of(jid, job.round, s) != 0}
    if job.open_disputes == len(owed) and now > job.window_end:
        # The round could settle now: without an attesting majority it needs the sample.
        majority = 2 * len(m.attestors_of(jid)) > len(m.committee_of(jid))
        if not majority and not av.evidenced(jid, job.round):
            try:
                sample = m.sampled_segments(jid)
            except ContractRevert:  # the seed block's hash is gone: fix_seed re-arms it
                sample = []
            owed |= {s for s in sample if not av.is_published(jid, job.round, s)}
    return sorted(owed)


async def publish_segments(solver: Solver, jid: JobId, segments: list[int]) -> None:
    """Put ``segments``' leaves on chain from our trace (fixing the seed first when the
    evidence rule needs it: `evidenced` reads the fixed seed's sample)."""
    from node.proof import build_trace_tree  # noqa: PLC0415
    from node.train.trace import read_manifest  # noqa: PLC0415 - torch is heavy

    rt, c = solver.rt, solver.rt.chain_client
    if await rt.chain(c.market.seed_of, jid) == bytes(32):
        job = await rt.chain(c.market.get_job, jid)
        if await rt.chain(c.block_number) > job.sample_block:
            await rt.transact_ok(c.market.fix_seed, jid, benign=("SeedAlreadyFixed",))
    manifest = read_manifest(solver._trace_dir(jid))
    leaves, tree = build_trace_tree(jid, manifest.k,
                                    [bytes.fromhex(h) for h in manifest.state_hashes],
                                    manifest.losses_e9)
    for s in segments:
        await rt.transact_ok(c.availability.publish, jid, s, leaves[s], tree.proof(s),
                             leaves[s + 1], tree.proof(s + 1), benign=PUBLISH_BENIGN)
        log.info("leaves_published", job=jid, segment=s)
