"""Issue 30, item 1, as the daemons play it (in-process nodes on a real anvil).

The solver daemon answers an availability request on its committed job and, with no
committee to attest, publishes its sample's leaves and is paid; a committee member that
cannot fetch a withholding solver's data withholds its attestation, names a segment of
its share and, the request unanswered, expires it: the round is condemned without
anyone replaying a step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from devnet.params import TOKEN
from devnet.testing import (
    FAKE_INIT,
    LocalChain,
    job_terms,
    node_settings,
    real_job_terms,
    sha,
    tiny_mlp_spec,
)
from node.chain.availability import RequestState
from node.chain.contracts import SOLVER, VERIFIER, JobStatus
from node.proof import MerkleTree, TraceLeaf
from tests.role_support import train_and_commit

pytestmark = pytest.mark.timeout(240)

STAKE = 500 * TOKEN


def test_solver_daemon_answers_a_request_then_publishes_its_sample(chain: LocalChain,
                                                                   tmp_path: Path) -> None:
    """Before: nothing asked a solver for its leaves and an unattested round was paid at
    the window's end. Now the daemon publishes a requested segment's leaves at once (the
    requester pays it a share of its bond), and with nobody to attest it puts the whole
    sample on chain after the window; one grace later it finalizes and is paid."""
    from node.datasets import pack_digits  # noqa: PLC0415
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.solver_machine import Finalize, PublishLeaves  # noqa: PLC0415

    digits = pack_digits()
    spec_b = tiny_mlp_spec(sha(digits), 4, 1)
    terms = real_job_terms(spec_b, digits, 4, 1)
    r = chain.reader
    mp, ap = r.market.market_params(), r.availability.availability_params()
    asker = chain[3]
    asker.token.ensure_allowance(r.availability.address, ap.bond)
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(node_settings(tmp_path, chain, "solver", 2, STAKE), "solver") as rt:
            solver, jid = await train_and_commit(rt, chain, 1, terms, spec_b, digits, STAKE)
            out["jid"] = jid
            out["rid"] = await rt.chain(asker.availability.request, jid, 2)
            passes = []
            async with trio.open_nursery() as nursery:
                passes.append(await solver._tick(nursery))
                out["answered"] = (await rt.chain(r.availability.get_request, out["rid"])).state
                await rt.chain(chain.advance, mp.verification_window + 1)
                passes.append(await solver._tick(nursery))
                await rt.chain(chain.advance, mp.dispute_grace + 1)
                passes.append(await solver._tick(nursery))
                nursery.cancel_scope.cancel()
            out["acts"] = [{(k, i): a for k, i, a in p if k == "job"} for p in passes]

    trio.run(main)
    jid = out["jid"]
    acts = [a[("job", jid)] for a in out["acts"]]
    assert acts[0] == PublishLeaves((2,)) and out["answered"] == RequestState.ANSWERED
    rest = tuple(s for s in sorted(r.market.sampled_segments(jid)) if s != 2)
    assert acts[1] == PublishLeaves(rest) and type(acts[2]) is Finalize
    assert r.market.get_job(jid).status == JobStatus.FINALIZED
    held, owed = chain.conservation()
    assert held == owed


def test_committee_member_requests_what_it_cannot_fetch_and_condemns(chain: LocalChain,
                                                                     tmp_path: Path) -> None:
    """Before: the two-leaf solver served nothing, the committee could neither replay nor
    challenge, and the round was paid. Now a committee member whose share cannot be
    fetched does not attest; past half the window it requests a segment of its share, and
    the solver unable to answer, it expires the request: the round is condemned."""
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.verifier import Verifier  # noqa: PLC0415
    from node.roles.verifier_machine import VerifierJob  # noqa: PLC0415

    verifiers = (4, 5, 6, 7, 8)
    for i in verifiers:
        chain.join(i, VERIFIER, 200 * TOKEN)
    solver = chain.join(2, SOLVER, STAKE)
    r = chain.reader
    jid = chain[1].post_job(job_terms(segments=12, k=5))
    solver.market.claim_job(jid)
    first = TraceLeaf(jid, 0, 0, FAKE_INIT, 0)
    last = TraceLeaf(jid, 12, 60, b"\x77" * 32, 1)
    tree = MerkleTree.from_leaves([first, last])
    solver.market.commit_result(jid, tree.root, last, tree.proof(0), tree.proof(1))
    chain.mine(5)
    chain[4].market.fix_seed(jid)
    me = next(i for i in verifiers if chain.addresses[i] in r.market.committee_of(jid))
    window = r.market.market_params().verification_window
    answer = r.availability.availability_params().answer_window
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(node_settings(tmp_path, chain, "verifier", me, 200 * TOKEN),
                           "verifier") as rt:
            v = Verifier(rt)
            with v.state as st:
                st.jobs[jid] = VerifierJob(round=1)
            await v._check_job(jid)  # the solver still has half its window to serve
            out["early"] = dict(v.state.data.jobs[jid].requests)
            await rt.chain(chain.advance, window // 2 + 1)
            await v._check_job(jid)
            out["requests"] = dict(v.state.data.jobs[jid].requests)
            await rt.chain(chain.advance, answer + 1)
            await v._check_job(jid)

    trio.run(main)
    assert out["early"] == {}
    ((seg, rid),) = out["requests"].items()
    assert r.availability.get_request(rid).state == RequestState.LOST
    assert r.market.round_info(jid, 1).condemned
    assert not r.market.has_attested(jid, chain.addresses[me])
    j = r.market.get_job(jid)
    chain.advance(j.window_end - chain.timestamp() + 1)
    rf = chain[me].market.finalize(jid)
    (paid,) = r.market.events(rf, "RewardPaid")
    assert paid["args"]["challenger"] == chain.addresses[me]
    assert r.market.get_job(jid).status == JobStatus.OPEN
    held, owed = chain.conservation()
    assert held == owed
