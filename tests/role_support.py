"""Test support that drives a role in-process (devnet/ imports no role: it sits
beside tests/, below node/roles in the layering, docs/architecture.md)."""

from __future__ import annotations

from devnet.testing import LocalChain, sha
from node.chain.contracts import SOLVER, JobTerms
from node.chain.ids import JobId
from node.roles.runtime import Runtime
from node.roles.solver import Solver
from node.roles.solver_machine import SolverJob


async def train_and_commit(rt: Runtime, c: LocalChain, submitter: int, terms: JobTerms,
                           spec_b: bytes, data: bytes, stake: int,
                           behavior: str = "honest") -> tuple[Solver, JobId]:
    """The solver daemon's own path on ``rt``: registered with ``stake``, holding the spec
    and data (as if fetched from the submitter), it claims the job dev account
    ``submitter`` posts with ``terms``, trains it with ``Solver._train_and_commit`` and
    commits. Returns the solver and the job id."""
    await rt.ensure_registered(SOLVER, stake)
    rt.p2p.store.put_bytes(spec_b)
    rt.p2p.store.put_bytes(data)
    jid = await rt.chain(c[submitter].post_job, terms)
    sc = rt.chain_client
    await rt.chain(sc.market.claim_job, jid)
    job = await rt.chain(sc.market.get_job, jid)
    solver = Solver(rt, behavior=behavior)
    with solver.state as st:
        st.jobs[jid] = SolverJob(round=job.round, spec=sha(spec_b), dataset=sha(data))
    await solver._train_and_commit(jid)
    return solver, jid
