"""A solver with a sparse trace (``keep_every`` > 1) serves the leaf states it did not
keep once somebody needs them: the two ends of each sampled segment (as soon as the
sample seed is known, well inside the verification window) and of each disputed
segment (jurors and the challenger load them). Each is regenerated bitwise from the
nearest kept checkpoint by the behaviour that trained it (``regenerate_many``), so
it hashes to its leaf, then published and announced like a bisection state
(``state_served``); verifiers find it by its state hash.

Public API::

    leaves_to_serve(manifest, segments, served) -> list[int]   # pure
    await keep_every_for(rt, jid, job, step_s) -> int            # at claim time
    sample_size_of(chain_client, jid) -> int                      # blocking
    await serve_missing_leaves(solver, nursery, jid)             # one call per tick
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from node.chain.ids import JobId
from node.errors import ContractRevert
from node.logs import get_logger
from node.roles.runtime import Runtime, guarded
from node.roles.solver_machine import SolverDisk
from node.roles.state import RoleState

if TYPE_CHECKING:
    from node.chain.client import ChainClient
    from node.chain.contracts import Job
    from node.train.behavior import SegmentBehavior
    from node.train.trace import TraceManifest


class Solver(Protocol):
    """What serving leaves needs of the solver daemon (node.roles.solver.Solver, which
    calls it): a protocol, so this module does not import its caller."""

    rt: Runtime
    state: RoleState[SolverDisk]
    behavior: SegmentBehavior
    _busy: set[str]

    def _trace_dir(self, jid: JobId) -> Path: ...

    async def _context(self, jid: JobId) -> Any: ...

    async def serve_state(self, jid: JobId, step: int, tensors: Any) -> str: ...

log = get_logger("polnet.solver.leaves")


def leaves_to_serve(manifest: TraceManifest, segments: Iterable[int],
                    served: Iterable[int]) -> list[int]:
    """Leaf indices at the ends of ``segments`` that the trace did not keep and that
    have not been served yet, ascending."""
    kept, done = set(manifest.kept), set(served)
    want = {i for s in segments if 0 <= s < manifest.segment_count for i in (s, s + 1)}
    return sorted(want - kept - done)


async def keep_every_for(rt: Runtime, jid: JobId, job: Job, step_s: float) -> int:
    """The node's ``keep_every``, lowered until regenerating a whole sample fits half
    the market's verification window at the probed step time (node.train.sparse). A
    reserved job (a collaborative inner run) is sampled as its final segment plus
    ``reserved_sample_count`` others, not the market's ``sample_count``."""
    from node.train.sparse import fit_keep_every  # noqa: PLC0415

    c = rt.chain_client
    mp = await rt.chain(c.market.market_params)
    samples = await rt.chain(sample_size_of, c, jid)
    return fit_keep_every(rt.settings.keep_every, window_s=mp.verification_window,
                          step_s=step_s, k=job.steps_per_segment, samples=samples)


def sample_size_of(c: ChainClient, jid: JobId) -> int:
    """Segments the market will sample of job ``jid`` (at most; fewer when the job has
    fewer): its final one plus ``reserved_sample_count`` for a reserved job, else the n
    its submitter bought (``Job.sample_count``). Blocking chain reads."""
    if int(str(c.market.reserved_solver_of(jid)), 16) != 0:
        return 1 + c.market.market_params().reserved_sample_count
    return c.market.get_job(jid).sample_count


def named_segments(c: ChainClient, jid: JobId, job: Job) -> list[int]:
    """Segments of the job's current round any availability request named, pending or
    answered (blocking chain reads)."""
    logs = c.availability.contract.events.Requested().get_logs(
        from_block=job.snapshot_block, argument_filters={"jobId": jid})
    return sorted({int(e["args"]["segment"]) for e in logs
                   if int(e["args"]["round"]) == job.round})


# (job, round, seed) -> sampled segments: fixed once the seed is, so read once
_SAMPLES: dict[tuple[int, int, bytes], list[int]] = {}


async def _needed_segments(solver: Solver, jid: JobId) -> list[int]:
    """From the process's chain snapshot: no getDispute (and its log searches) per
    dispute per tick, and the sample read once per round's seed."""
    rt, c = solver.rt, solver.rt.chain_client
    snap = await rt.snapshot()
    job = snap.jobs.get(jid)
    if job is None:  # not in the view yet (a job of a block it has not taken in)
        job = await rt.chain(c.market.get_job, jid)
    segments: list[int] = []
    key = (jid, job.round, job.seed)
    if job.seed != bytes(32) and key in _SAMPLES:
        segments += _SAMPLES[key]
    else:
        with contextlib.suppress(ContractRevert):  # SeedNotFixed: its block is not mined yet
            sample = list(await rt.chain(c.market.sampled_segments, jid))
            segments += sample
            if job.seed != bytes(32):
                if len(_SAMPLES) >= 4096:  # bounded: settled jobs' samples go
                    _SAMPLES.clear()
                _SAMPLES[key] = sample
    for did in list(solver.state.data.disputes):
        d = snap.disputes.get(did)
        if d is None:
            d = await rt.chain(c.dispute.get_dispute, did)
        if d.job_id == jid:
            segments.append(d.segment)
    if c.deployment is not None and "Availability" in c.deployment.contracts:
        # a segment named by an availability request: its requester wants to replay it,
        # sampled or not (a watcher's), and still does once the answer put its leaves on
        # chain, so answered requests count too (the answer may land before this pass)
        segments += await rt.chain(named_segments, c, jid, job)
    return segments


async def serve_missing_leaves(solver: Solver, nursery: trio.Nursery, jid: JobId) -> None:
    """Start regenerating and serving what is needed and missing (no-op for a dense
    trace, or while a previous pass for the job still runs)."""
    from node.train.trace import read_manifest  # noqa: PLC0415 - torch is heavy

    key = f"leaves{jid}"
    if key in solver._busy:
        return
    trace = solver._trace_dir(jid)
    manifest = read_manifest(trace)
    if manifest.keep_every == 1:
        return
    info = solver.state.data.jobs[jid]
    todo = leaves_to_serve(manifest, await _needed_segments(solver, jid), info.leaves_served)
    if todo:
        solver._busy.add(key)
        nursery.start_soon(guarded, "serve_leaves", _serve, solver, jid, manifest, todo, key)


async def _serve(solver: Solver, jid: JobId, manifest: TraceManifest, todo: list[int],
                 key: str) -> None:
    from node.train.sparse import nearest_kept  # noqa: PLC0415
    from node.train.trace import regenerate_many  # noqa: PLC0415

    try:
        ctx = await solver._context(jid)
        k = manifest.k
        blocks: dict[int, list[int]] = {}
        for index in todo:
            blocks.setdefault(nearest_kept(index, manifest.kept), []).append(index)
        # One walk per kept checkpoint, its leaves served as soon as it ends: verifiers
        # start on the first segments while later ones are still being regenerated.
        for leaves in blocks.values():
            t0 = trio.current_time()
            states = await trio.to_thread.run_sync(
                lambda ls=leaves: regenerate_many(ctx, solver._trace_dir(jid),
                                                  [i * k for i in ls],
                                                  behavior=solver.behavior))
            for index in leaves:
                await solver.serve_state(jid, index * k, states[index * k])
                with solver.state as st:
                    served = st.jobs[jid].leaves_served
                    if index not in served:
                        served.append(index)
            log.info("leaves_served", job=jid, leaves=leaves,
                     seconds=round(trio.current_time() - t0, 2))
    finally:
        solver._busy.discard(key)
