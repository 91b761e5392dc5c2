"""Collaborative jobs in the chain view (issue 31): a snapshot holds the CollabMarket's
rounds, slot holders and orphan counts and the OuterJury's cases, read in the per-block
batch only where new events name them; the CollabFollower reads them from the snapshot,
so a tick without a new block makes no request. On a real anvil, counted by the
(non-throttling) proxy of devnet/rpcproxy.py; the contracts are driven by the chain-level
helpers of tests/test_collab_market.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eth_utils import keccak

from devnet.rpcproxy import RpcProxy
from devnet.testing import LocalChain
from node.chain.client import ChainClient
from node.chain.view import ChainView
from tests.test_collab_market import (
    Net,
    _challenge_and_draw,
    make_net,
    post_outer,
    settled_one_round_job,
)


@pytest.fixture
def net(chain: LocalChain) -> Net:
    return make_net(chain)


@pytest.fixture
def proxy(chain: LocalChain) -> Iterator[RpcProxy]:
    p = RpcProxy(chain.url).start()
    try:
        yield p
    finally:
        p.stop()


def _same_collab_state(view: ChainView, net: Net, job: int, case: int | None) -> None:
    snap = view.snapshot
    assert snap is not None
    r = net.chain.reader
    assert snap.collabs[job] == r.collab.get_collab(job)
    for q in (0, 1):  # round 1 was never started: the contract's all-zero round
        assert snap.round(job, q) == r.collab.get_round(job, q), q
    assert list(snap.holders[job]) == [str(h) for h in r.collab.slot_holders(job)]
    assert snap.orphans[job] == r.collab.orphans_of(job)
    if case is not None:
        assert snap.cases[case] == r.outer_jury.get_case(case)


def test_view_holds_rounds_cases_holders_and_orphans(net: Net, proxy: RpcProxy) -> None:
    view = ChainView(ChainClient(proxy.url, None, net.chain.deployment))
    job = settled_one_round_job(net)
    view.update()  # first: everything since the deployment block
    _same_collab_state(view, net, job, None)
    post_outer(net, net.workers[2], job, 0, keccak(b"forged"))
    case, jury = _challenge_and_draw(net, job, 0, net.submitter)
    before = proxy.counts["total"]
    view.update()
    # the new blocks: blockNumber, one batch (headers + logs), one batch of eth_call
    assert proxy.counts["total"] - before == 3
    _same_collab_state(view, net, job, case)
    net.by_address(jury[0]).outer_jury.commit_vote(case, False, keccak(b"salt"))
    view.update()
    _same_collab_state(view, net, job, case)
    assert view.snapshot is not None and view.snapshot.round(12345, 0) is None  # no such job
