"""The submitter decides over the process's chain view (issue 31): serving N jobs, a
pass without a new block reads nothing per job (before, every job's getJob and the
market's credits every second), and a submitter behind a throttling provider still sees
its job finalize and withdraws. On a real anvil behind the proxy of devnet/rpcproxy.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from devnet.params import TOKEN
from devnet.rpcproxy import RpcProxy, Throttle
from devnet.testing import LocalChain, fake_trace, job_terms, node_settings
from node.chain.client import ChainClient
from node.chain.contracts import SOLVER
from node.chain.ids import JobId
from node.chain.rpc import RpcSettings

REWARD, BUDGET, STAKE = 100 * TOKEN, 10 * TOKEN, 500 * TOKEN
SUBMITTER, SOLVER_ACCT = 1, 2
N = 6


def post_jobs(chain: LocalChain, n: int) -> list[JobId]:
    sub = chain[SUBMITTER]
    sub.token.ensure_allowance(sub.market.address, n * (REWARD + BUDGET))
    return [sub.market.post_job(job_terms(REWARD, BUDGET)) for _ in range(n)]


def finalize(chain: LocalChain, solver: ChainClient, jid: JobId) -> None:
    """Claimed, committed, its sample published, past the window and the grace: final."""
    params = chain.reader.market.market_params()
    solver.market.claim_job(jid)
    leaves, tree = fake_trace(jid)
    solver.market.commit_trace(jid, leaves, tree)
    chain.advance(params.verification_window + 5)
    chain.publish_sample(solver, jid, leaves, tree)  # no committee: paid on the sample
    chain.advance(params.dispute_grace + 1)
    solver.market.finalize(jid)


def test_a_pass_without_a_new_block_reads_nothing_per_job(chain: LocalChain, proxy: RpcProxy,
                                                          tmp_path: Path) -> None:
    """N open jobs served: between blocks the loop makes only the view's blockNumber
    polls and no eth_call; a new block without events of ours adds the view's one batch
    (headers + logs) and still no eth_call; a pass over a snapshot reads nothing."""
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.submitter import serve_pass, serve_until_final  # noqa: PLC0415

    jobs = post_jobs(chain, N)
    settings = node_settings(tmp_path, chain, "submitter", SUBMITTER, 0)
    settings.rpc_url = proxy.url
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(settings, "submitter") as rt:
            snap = await rt.snapshot(fresh=True)
            assert all(j in snap.jobs for j in jobs)
            await trio.sleep(0.5)  # the runtime's first registry pass is over
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_until_final, rt, jobs, None)
                await trio.sleep(0.5)  # its first pass, on the snapshot taken above
                before = proxy.methods.copy()
                await trio.sleep(2.0)  # about 10 polls at poll_interval 0.2, no block
                out["idle"] = dict(proxy.methods - before)
                before = proxy.methods.copy()
                chain.mine(1)
                await trio.sleep(1.0)
                out["block"] = dict(proxy.methods - before)
                nursery.cancel_scope.cancel()
            left = set(jobs)
            snap = await rt.snapshot()  # may poll the view: not the pass's own reads
            before_total = proxy.counts["total"]
            await serve_pass(rt, snap, left)
            out["pass"] = proxy.counts["total"] - before_total
            out["left"] = left

    trio.run(main)
    assert set(out["idle"]) == {"eth_blockNumber"}, out  # no getJob, no credits
    assert out["idle"]["eth_blockNumber"] <= 12, out
    assert "eth_call" not in out["block"], out
    assert out["block"].get("eth_getLogs") == 1, out  # the view's one batch for the block
    assert out["pass"] == 0, out
    assert out["left"] == set(jobs), out  # open jobs: still served


def test_a_throttled_submitter_sees_its_job_final_and_withdraws(
        chain: LocalChain, proxy: RpcProxy, tmp_path: Path) -> None:
    """Behind a proxy answering 429s and -32005s the loop lives on (a pass that failed
    is retried on the next poll), sees the job another party finalized and withdraws
    the verification budget nobody earned."""
    from node.roles.runtime import Runtime  # noqa: PLC0415
    from node.roles.submitter import serve_until_final  # noqa: PLC0415

    solver = chain.join(SOLVER_ACCT, SOLVER, STAKE)
    (jid,) = post_jobs(chain, 1)
    settings = node_settings(tmp_path, chain, "submitter", SUBMITTER, 0)
    settings.rpc_url = proxy.url
    settings.rpc = RpcSettings(timeout=1.0, retries=3, backoff=0.01, max_backoff=0.05)
    balance0 = chain.reader.token.balance_of(chain.addresses[SUBMITTER])

    async def main() -> None:
        async with Runtime(settings, "submitter") as rt:
            proxy.throttle = Throttle(p429=0.3, p32005=0.1, seed=3)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, finalize, chain, solver, jid)
                with trio.fail_after(60):
                    await serve_until_final(rt, [jid], timeout=None)

    trio.run(main)
    assert proxy.counts["429"] > 0, proxy.counts
    gained = chain.reader.token.balance_of(chain.addresses[SUBMITTER]) - balance0
    assert gained == BUDGET
    assert chain.reader.market.credits(chain.addresses[SUBMITTER]) == 0
