"""Issue 37, item 3: a live dispute clock spent on junk jobs. On anvil, a real solver
Runtime with one of its commits disputed and a stream of job posts whose inputs
nobody serves."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from devnet.params import TOKEN
from devnet.testing import LocalChain, fake_trace, job_terms, node_settings
from node.chain.contracts import SOLVER, VERIFIER, JobTerms
from node.chain.ids import DisputeId
from node.roles import solver_machine as sm

STAKE = 500 * TOKEN
REWARD = 100 * TOKEN
JUNK = 3


def test_dispute_moves_come_before_any_candidate_job(chain: LocalChain, tmp_path: Path) -> None:
    """Attack: while one of a solver's commits is disputed (its turn to post mids),
    post jobs whose inputs nobody serves: each consideration waits up to 60 s for its
    inputs, then a probe of up to 120 s. Before: ``Solver._tick`` considered every
    candidate inline before any dispute move, so N such posts held the dispute move for
    N x 60 s or more (with ``--max-jobs`` above 1). Now the pass decides the dispute move
    first and considers candidates in the background, one at a time: the pass returns
    with the mids under way while a junk job is still being considered, and the next
    pass moves again without waiting for it."""
    from node.chain.events import EventWatcher  # noqa: PLC0415 - web3 is heavy
    from node.roles.runtime import Runtime  # noqa: PLC0415
    from node.roles.solver import Solver  # noqa: PLC0415

    verifiers = (4, 5, 6, 7, 8)
    for i in verifiers:
        chain.join(i, VERIFIER, 200 * TOKEN)
    me = chain.join(2, SOLVER, STAKE)
    sub = chain[1]
    sub.token.ensure_allowance(sub.market.address, REWARD + 10 * TOKEN + JUNK * 20 * TOKEN)
    jid = sub.market.post_job(job_terms(REWARD, 10 * TOKEN))
    me.market.claim_job(jid)
    leaves, tree = fake_trace(jid)
    me.market.commit_trace(jid, leaves, tree)
    did = chain[4].market.challenge(jid, 3, leaves[3], tree.proof(3), leaves[4], tree.proof(4))
    base = job_terms(10 * TOKEN, 5 * TOKEN)
    junk = [sub.market.post_job(JobTerms(**{**base.__dict__,
                                            "spec_hash": os.urandom(32),
                                            "dataset_hash": os.urandom(32)}))
            for _ in range(JUNK)]
    settings = node_settings(tmp_path, chain, "solver", 2, STAKE)
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(settings, "solver") as rt:
            c = rt.chain_client
            assert c.deployment is not None
            j = await rt.chain(c.market.get_job, jid)
            # On our books as a committed job (the solver that trained it).
            (rt.dir / "solver.json").write_text(json.dumps({
                "jobs": {str(jid): {"round": j.round, "phase": "committed",
                                    "spec": j.spec_hash.hex(), "dataset": j.dataset_hash.hex()}},
                "candidates": [], "disputes": [], "served": [], "rejected": {},
                "considering": {}}))
            solver = Solver(rt, max_jobs=3)
            watcher = EventWatcher(c.w3, [c.market, c.dispute],
                                   start_block=c.deployment.deploy_block)
            async with trio.open_nursery() as nursery:
                await rt.chain(watcher.poll, solver._on_event)
                out["candidates"] = list(solver.state.data.candidates)
                out["pass1"] = await solver._tick(nursery)
                out["busy1"] = set(solver._busy)
                out["pass2"] = await solver._tick(nursery)
                out["busy2"] = set(solver._busy)
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert set(junk) <= set(out["candidates"]), out
    p1 = [(k, i, type(a)) for k, i, a in out["pass1"]]
    assert p1[0] == ("dispute", did, sm.PostMids), p1  # the first thing the pass did
    # One junk job is being considered in the background, no more; the pass did not
    # wait for it.
    considering = {k for k in out["busy1"] if k.startswith("c")}
    assert len(considering) == 1 and considering <= {f"c{j}" for j in junk}, out
    assert considering <= out["busy2"], out  # still under way at the next pass
    p2 = [(k, i, type(a)) for k, i, a in out["pass2"]]
    assert p2[0][:2] == ("dispute", did), p2


def test_verifier_moves_its_dispute_while_a_collab_job_holds_the_pass(
        chain: LocalChain, tmp_path: Path) -> None:
    """Attack: a collaborative job in its outer phase whose spec nobody serves (the
    follower waits up to 120 s for it in every pass) while the verifier is a challenger
    in a live dispute. Before: the verifier started its dispute moves at the end of
    the pass, after the collaborative follow-up, so each pass held them 120 s. Now the
    dispute move runs while that pass is still waiting on the collaborative job."""
    from node.chain.events import EventWatcher  # noqa: PLC0415 - web3 is heavy
    from node.roles.runtime import Runtime  # noqa: PLC0415
    from node.roles.verifier import Verifier  # noqa: PLC0415
    from tests.test_collab_market import Net, claim_all, post, terms, window, work  # noqa: PLC0415
    from tests.test_collab_market import solver as collab_solver  # noqa: PLC0415

    verifiers = (4, 5, 6, 7, 8)
    for i in verifiers:
        chain.join(i, VERIFIER, 200 * TOKEN)
    me_solver = chain.join(2, SOLVER, STAKE)
    sub = chain[1]
    sub.token.ensure_allowance(sub.market.address, REWARD + 10 * TOKEN)
    jid = sub.market.post_job(job_terms(REWARD, 10 * TOKEN))
    me_solver.market.claim_job(jid)
    leaves, tree = fake_trace(jid)
    me_solver.market.commit_trace(jid, leaves, tree)
    chain.mine(5)
    chain[4].market.fix_seed(jid)
    committee = chain.reader.market.committee_of(jid)
    me = next(i for i in verifiers if chain.addresses[i] in committee)
    did = chain[me].market.challenge(jid, 3, leaves[3], tree.proof(3), leaves[4],
                                     tree.proof(4))
    # A collaborative job in its outer phase; its spec hash names bytes nobody serves.
    me_solver.token.approve(me_solver.collab.address, 1_000 * TOKEN)
    net = Net(chain, submitter=chain[1], workers=[me_solver, collab_solver(chain, 3),
                                                  collab_solver(chain, 9)],
              verifiers=[], outsider=chain[0])
    cid = post(net, terms(rounds=1))
    claim_all(net, cid)
    net.outsider.collab.start_round(cid)
    work(net, cid, 0)
    chain.advance(window(net))
    net.outsider.collab.settle_round(cid)
    assert chain.reader.collab.get_collab(cid).phase == 2  # Outer
    settings = node_settings(tmp_path, chain, "verifier", me, 200 * TOKEN)
    out: dict[str, Any] = {}

    class Watched(Verifier):
        """The real daemon; it only notes whether its pass was over at each move."""

        tick_over = True
        moves: list[bool]

        async def _dispute_move(self, did: DisputeId) -> object:
            self.moves.append(self.tick_over)
            return await super()._dispute_move(did)

    async def main() -> None:
        async with Runtime(settings, "verifier") as rt:
            c = rt.chain_client
            assert c.deployment is not None
            v = Watched(rt)
            v.moves = []
            watcher = EventWatcher(c.w3, [c.market, c.dispute],
                                   start_block=c.deployment.deploy_block)
            await rt.chain(watcher.poll, v._on_event)
            out["disputes"] = list(v.state.data.disputes)

            async def one_pass(nursery: trio.Nursery) -> None:
                v.tick_over = False
                await v._tick(nursery)
                v.tick_over = True

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one_pass, nursery)
                with trio.move_on_after(60):
                    while not v.moves:
                        await trio.sleep(0.1)
                out["moves"] = list(v.moves)
                out["pass_over"] = v.tick_over
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert out["disputes"] == [did], out
    # The move ran while the pass was still held by the collaborative job.
    assert out["moves"] == [False] and out["pass_over"] is False, out
