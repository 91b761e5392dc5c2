"""Collaborative jobs in the chain view (issue 31): a snapshot holds the CollabMarket's
rounds, slot holders and orphan counts and the OuterJury's cases, read in the per-block
batch only where new events name them; the CollabFollower reads them from the snapshot,
so a tick without a new block makes no request. On a real anvil, counted by the
(non-throttling) proxy of devnet/rpcproxy.py; the contracts are driven by the chain-level
helpers of tests/test_collab_market.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from eth_utils import keccak

from devnet.rpcproxy import RpcProxy
from devnet.testing import LocalChain, node_settings
from node.chain.client import ChainClient
from node.chain.ids import CaseId, CollabId
from node.chain.rpc import RpcSettings
from node.chain.view import ChainView
from tests.test_collab_market import (
    Net,
    _challenge_and_draw,
    init,
    make_net,
    outer,
    post_outer,
    settled_one_round_job,
)

FOLLOWER = 9  # the Net's outsider: funded, in no slot and on no jury


@pytest.fixture
def net(chain: LocalChain) -> Net:
    return make_net(chain)


def _same_collab_state(view: ChainView, net: Net, job: CollabId, case: CaseId | None) -> None:
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
    no_job = CollabId(12345)
    assert view.snapshot is not None and view.snapshot.round(no_job, 0) is None


@asynccontextmanager
async def follower_runtime(tmp_path: Path, chain: LocalChain, url: str,
                           rpc: RpcSettings | None = None) -> AsyncIterator[Any]:
    """(runtime, follower) of a verifier-side CollabFollower reaching the chain at ``url``.
    Its recomputed outer state is the one the Net's honest helpers post (outer(r), the
    round after's S_0): the follower's chain moves are what is under test, not training."""
    from node.roles.collab import CollabFollower  # noqa: PLC0415 - libp2p is heavy
    from node.roles.runtime import Runtime  # noqa: PLC0415
    from node.roles.verifier_evidence import Evidence  # noqa: PLC0415

    settings = node_settings(tmp_path, chain, "follower", FOLLOWER, 0)
    settings.rpc_url = url
    if rpc is not None:
        settings.rpc = rpc
    async with Runtime(settings, "verifier") as rt:
        f = CollabFollower(rt, Evidence(rt))

        async def honest(cid: CollabId, r: int) -> tuple[bytes, bytes]:
            return outer(r), init(r + 1)

        f.next_hashes = honest  # type: ignore[method-assign]
        yield rt, f


def test_a_follower_tick_without_a_new_block_reads_nothing(net: Net, proxy: RpcProxy,
                                                           tmp_path: Path) -> None:
    """A live job in its outer window, posted with what the follower recomputes: nothing
    to do. Before, each tick read collabCount, getCollab, getRound, the timestamp...
    (several calls per job per 0.5 s); now a tick on the snapshot it already took in
    makes no request, also past the idle re-pass timer."""
    from node.roles import collab as collab_mod  # noqa: PLC0415

    job = settled_one_round_job(net)
    post_outer(net, net.submitter, job, 0)
    out: dict[str, Any] = {}

    async def main() -> None:
        async with follower_runtime(tmp_path, net.chain, proxy.url) as (rt, f):
            snap = await rt.snapshot(fresh=True)
            await f.tick(snap)  # the first pass: the job is followed, nothing is due
            out["followed"] = job in snap.collabs and snap.round(job, 0) is not None
            before = proxy.counts["total"]
            for _ in range(5):
                await f.tick(snap)
            out["same_block"] = proxy.counts["total"] - before
            # the idle re-pass (IDLE_PASS_S after the last, no block): all from the snapshot.
            # Its timer moved back rather than slept through: the runtime's own loops
            # (peers, announcements) make requests meanwhile.
            f._ran_at -= collab_mod.IDLE_PASS_S
            before = proxy.counts["total"]
            await f.tick(snap)
            out["idle_pass"] = proxy.counts["total"] - before
            net.chain.mine(1)  # a new block without our events
            snap = await rt.snapshot(fresh=True)
            before = proxy.counts["total"]
            await f.tick(snap)
            out["new_block"] = proxy.counts["total"] - before
            out["sent"] = proxy.methods["eth_sendRawTransaction"]

    trio.run(main)
    assert out["followed"], out
    assert out["same_block"] == 0, out
    assert out["idle_pass"] == 0, out
    assert out["new_block"] == 0, out
    assert out["sent"] == 0, out  # nothing was due: no move
