"""The chain view (node/chain/view.py) on a real anvil: it follows jobs and disputes
created in new blocks with a fixed number of requests per block (counted by the
throttling proxy of devnet/rpcproxy.py, with no throttling), costs one request per
update while no block arrives, and rebuilds when the chain it saw is reverted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from devnet.anvil import AnvilProcess
from devnet.params import TOKEN
from devnet.rpcproxy import RpcProxy
from devnet.testing import LocalChain, fake_trace, job_terms, node_settings
from node.chain.client import ChainClient
from node.chain.contracts import SOLVER, VERIFIER, JobStatus, Phase
from node.chain.ids import JobId
from node.chain.view import ChainView, EventFeed
from node.roles import verifier_machine as vm
from tests.test_dispute_game import CHAL, CHAL2, challenge, deploy_game, new_job
from tests.test_dispute_game import PARAMS as GAME_PARAMS

PARAMS = GAME_PARAMS


@pytest.fixture(scope="module")
def vchain(anvil: AnvilProcess) -> LocalChain:
    return deploy_game(anvil, PARAMS)


@pytest.fixture
def c(vchain: LocalChain) -> Iterator[LocalChain]:
    snap = vchain.snapshot()
    try:
        yield vchain
    finally:
        vchain.revert(snap)


@pytest.fixture
def proxy(vchain: LocalChain) -> Iterator[RpcProxy]:
    p = RpcProxy(vchain.url).start()
    yield p
    p.stop()


def _view(c: LocalChain, proxy: RpcProxy) -> ChainView:
    return ChainView(ChainClient(proxy.url, None, c.deployment))


def test_view_follows_new_jobs_and_disputes_one_batch_per_block(
        c: LocalChain, proxy: RpcProxy) -> None:
    view = _view(c, proxy)
    first = view.update()
    jobs_before = set(first.jobs)
    # Idle: one eth_blockNumber per update, the same snapshot back.
    n = proxy.counts["total"]
    for _ in range(5):
        assert view.update() is first
    assert proxy.counts["total"] - n == 5
    assert proxy.methods["eth_blockNumber"] >= 5

    job = new_job(c)  # post, claim, commit, seed, attest: many blocks
    snap = view.update()
    assert snap.block > first.block
    assert set(snap.jobs) - jobs_before == {job.id}
    assert snap.jobs[job.id].status == JobStatus.COMMITTED
    assert snap.jobs[job.id] == c.reader.market.get_job(job.id)
    assert {e.event for e in snap.events} >= {"JobPosted", "ResultCommitted", "Attested"}

    # One new block holding a dispute: blockNumber + one batch (reorg check, header,
    # logs) + one batch of eth_calls, however many jobs are on chain.
    did = challenge(c, job, CHAL)
    n = proxy.counts["total"]
    snap = view.update()
    assert proxy.counts["total"] - n == 3
    d = snap.disputes[did]
    assert d == c.reader.dispute.get_dispute(did)  # range hashes from events included
    assert d.phase == Phase.BISECTION and did in snap.live_disputes()
    assert snap.jobs[job.id].open_disputes == 1

    # Blocks with unrelated events (approve, stake): the live dispute is re-read (its
    # clocks move), still in the one batch.
    c[CHAL2].stake(1)
    n = proxy.counts["total"]
    snap2 = view.update()
    assert proxy.counts["total"] - n == 3
    assert snap2.block > snap.block
    assert snap2.timestamp >= snap.timestamp
    assert snap2.disputes[did].challenger_clock_left <= d.challenger_clock_left
    # The snapshot is frozen: roles cannot change what others read.
    with pytest.raises(TypeError):
        snap2.jobs[job.id] = snap2.jobs[job.id]  # type: ignore[index]


def test_view_rebuilds_after_reorg(c: LocalChain, proxy: RpcProxy) -> None:
    view = _view(c, proxy)
    base = view.update()
    snap_id = c.snapshot()
    job = new_job(c, attest=False)
    seen = view.update()
    assert job.id in seen.jobs and seen.epoch == base.epoch
    # The chain goes back and grows again past where the view was, on other blocks:
    # the hash of the view's last block changed, so it rebuilds (new epoch) and the
    # reverted job is gone.
    c.revert(snap_id)
    c[CHAL2].stake(1)
    c.mine(seen.block - base.block + 2)
    after = view.update()
    assert after.block > seen.block
    assert after.epoch == seen.epoch + 1
    assert job.id not in after.jobs
    assert set(after.jobs) == set(base.jobs)
    assert any(e.event == "Staked" for e in after.events)  # a rebuild replays everything


def test_view_rebuilds_when_chain_shrinks(c: LocalChain, proxy: RpcProxy) -> None:
    view = _view(c, proxy)
    snap_id = c.snapshot()
    job = new_job(c, attest=False)
    seen = view.update()
    assert job.id in seen.jobs
    c.revert(snap_id)  # the head is now below the view's block
    after = view.update()
    assert after.block < seen.block and after.epoch == seen.epoch + 1
    assert job.id not in after.jobs


def test_verifier_pass_requests_do_not_grow_with_jobs(chain: LocalChain, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The verifier's pass reads the jobs it follows from the process's snapshot: a
    pass over 3 followed jobs costs the requests a pass over 1 does (before the view,
    each followed job was one getJob per pass)."""
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.verifier import Verifier  # noqa: PLC0415

    chain.join(3, VERIFIER, 200 * TOKEN)
    solver = chain.join(2, SOLVER, 500 * TOKEN)
    sub = chain[1]
    sub.token.ensure_allowance(sub.market.address, 10**27)
    jobs = []
    for _ in range(3):  # committed, in their window (each bond locks 150 of the stake)
        jid = sub.market.post_job(job_terms(100 * TOKEN, 10 * TOKEN))
        solver.market.claim_job(jid)
        leaves, tree = fake_trace(jid)
        solver.market.commit_trace(jid, leaves, tree)
        jobs.append(jid)
    async def no_discovery(self: Runtime) -> None:
        await trio.sleep_forever()

    # Peer discovery reads the chain on its own clock: counted, it would blur the pass's.
    monkeypatch.setattr(Runtime, "_registry_peers_loop", no_discovery)
    proxy = RpcProxy(chain.url).start()
    settings = node_settings(tmp_path, chain, "verifier", 3, 200 * TOKEN)
    settings.rpc_url = proxy.url
    out: dict[int, Any] = {}

    def follow(v: Verifier, ids: list[JobId]) -> None:
        with v.state as st:  # checked, passed, attested: each pass only waits on them
            for j in ids:
                st.jobs[j] = vm.VerifierJob(round=1, checked=True, verdicts={0: True},
                                            attested=True)

    async def main() -> None:
        async with Runtime(settings, "verifier") as rt:
            v = Verifier(rt)
            async with trio.open_nursery() as nursery:
                for ids in (jobs[:1], jobs):
                    follow(v, ids)
                    await v._tick(nursery)  # the view takes the new ids in
                    n = proxy.counts["total"]
                    taken = await v._tick(nursery)
                    out[len(ids)] = (proxy.counts["total"] - n,
                                     {i: type(a) for _, i, a in taken})
                nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        proxy.stop()
    (small, acts1), (big, acts3) = out[1], out[3]
    assert acts1 == {j: vm.Wait for j in jobs[:1]}
    assert acts3 == {j: vm.Wait for j in jobs}  # every followed job was decided on
    assert big == small, out
    assert small <= 3, out  # blockNumber (+ collab job count); no block, no batch


def test_event_feed_resumes_from_its_cursor_and_replays_after_a_reorg(
        c: LocalChain, proxy: RpcProxy, tmp_path: Path) -> None:
    cursor = tmp_path / "feed.cursor"
    view = _view(c, proxy)
    view.update()
    feed = EventFeed(view, cursor_path=cursor)
    first = feed.take()
    assert first and feed.take() == []  # each event once
    feed.done()
    snap_id = c.snapshot()
    job = new_job(c, attest=False)
    view.update()
    new = feed.take()
    assert {e.event for e in new} >= {"JobPosted", "ResultCommitted"}
    assert all(e.block_number > first[-1].block_number for e in new)
    # A restarted process (a new view from the deployment block) resumes after the
    # block its cursor holds: what it handled before is not delivered again.
    feed.done()
    view2 = _view(c, proxy)
    view2.update()
    assert EventFeed(view2, cursor_path=cursor).take() == []
    # A reorg: the view rebuilds, the feed says so and delivers the new epoch again.
    c.revert(snap_id)
    view.update()
    again = feed.take()
    assert feed.restarted and not any(int(e.args.get("jobId", 0)) == job.id
                                      and e.event == "ResultCommitted" for e in again)
    assert len(again) >= len(first)
