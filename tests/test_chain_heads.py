"""New heads over a WebSocket (node/chain/heads.py): an idle view makes no request
between blocks, a block still costs its one batch, and a socket that is down, or
that went quiet, leaves the node on HTTP instead of stopping it (real anvil, which
serves WebSocket on its HTTP port; requests counted at the proxy)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from devnet.params import TOKEN
from devnet.rpcproxy import RpcProxy
from devnet.testing import LocalChain, fake_trace, job_terms
from node.chain.client import ChainClient
from node.chain.contracts import SOLVER, JobStatus
from node.chain.heads import HeadSubscription
from node.chain.rpc import RpcSettings
from node.chain.view import ChainView
from node.config import NetworkProfile

pytestmark = pytest.mark.parallel
ROOT = Path(__file__).resolve().parents[1]


def _until(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _ws(chain: LocalChain) -> str:
    return chain.url.replace("http://", "ws://", 1)


def test_an_idle_view_on_pushed_heads_makes_no_request_between_blocks(
        chain: LocalChain, proxy: RpcProxy) -> None:
    heads = HeadSubscription(_ws(chain), check_every=3600).start()
    try:
        view = ChainView(ChainClient(proxy.url, None, chain.deployment), heads=heads)
        _until(lambda: heads.connections == 1, "the subscription")
        chain.mine(1)
        _until(lambda: heads.head() == chain.w3.eth.block_number, "the pushed head")
        first = view.update()  # the first update reads everything (and checks the head)
        assert first.block == heads.head()
        n, calls = proxy.counts["total"], proxy.methods["eth_blockNumber"]
        for _ in range(20):
            assert view.update() is first
        assert proxy.counts["total"] == n  # not even an eth_blockNumber

        chain.mine(1)
        _until(lambda: (heads.head() or 0) > first.block, "the next head")
        snap = view.update()
        assert snap.block == heads.head() and snap.block > first.block
        # The block's batch (reorg check, header, logs) and its reads; no block number.
        assert 1 <= proxy.counts["total"] - n <= 2
        assert proxy.methods["eth_blockNumber"] == calls
    finally:
        heads.close()
    assert not heads._thread.is_alive()  # noqa: SLF001 - closing ends the socket's thread


def test_the_head_is_still_checked_over_http_and_a_quiet_socket_is_renewed(
        chain: LocalChain, proxy: RpcProxy) -> None:
    heads = HeadSubscription(_ws(chain), check_every=0.3).start()
    try:
        view = ChainView(ChainClient(proxy.url, None, chain.deployment), heads=heads)
        _until(lambda: heads.connections == 1, "the subscription")
        chain.mine(1)
        _until(lambda: heads.head() is not None, "a pushed head")
        view.update()
        time.sleep(0.35)
        calls = proxy.methods["eth_blockNumber"]
        view.update()
        assert proxy.methods["eth_blockNumber"] == calls + 1  # the periodic check
        # The socket misses blocks (as a proxy's idle timeout would make it): the check
        # finds the chain ahead, drops the subscription and makes a new one.
        heads.mark_stale(0)
        chain.mine(3)
        time.sleep(0.35)
        snap = view.update()  # over HTTP meanwhile: the view is not held back
        assert snap.block == chain.w3.eth.block_number
        _until(lambda: heads.connections == 2, "the renewed subscription")
        chain.mine(1)
        _until(lambda: heads.head() == chain.w3.eth.block_number, "heads again")
    finally:
        heads.close()


def test_a_socket_that_cannot_connect_leaves_the_view_on_http(
        chain: LocalChain, proxy: RpcProxy) -> None:
    heads = HeadSubscription("ws://127.0.0.1:9", check_every=3600).start()  # nothing there
    try:
        view = ChainView(ChainClient(proxy.url, None, chain.deployment), heads=heads)
        view.update()
        chain.mine(2)
        calls = proxy.methods["eth_blockNumber"]
        snap = view.update()
        assert snap.block == chain.w3.eth.block_number
        assert proxy.methods["eth_blockNumber"] == calls + 1
        assert heads.head() is None and heads.connections == 0
    finally:
        heads.close(timeout=10)
    assert not heads._thread.is_alive()  # noqa: SLF001


def test_settings_put_a_websocket_endpoint_in_ws_url_only() -> None:
    assert RpcSettings(ws_url="wss://example.org/ws").ws_url == "wss://example.org/ws"
    with pytest.raises(ValidationError, match="ws_url"):
        RpcSettings(ws_url="https://example.org")
    with pytest.raises(ValidationError, match="rpc_url"):
        NetworkProfile.model_validate({"rpc_url": "wss://example.org/ws", "chain_id": 1,
                                       "deployment": "d.json"})
    with pytest.raises(ValueError, match="WebSocket"):
        HeadSubscription("http://127.0.0.1:8545")


def test_a_verifier_daemon_on_pushed_heads_does_its_job_without_asking_for_blocks(
        chain: LocalChain, proxy: RpcProxy, tmp_path: Path) -> None:
    """A real `polnet verifier run` with `[rpc] ws_url` (anvil's WebSocket) and its HTTP
    through the counting proxy: while idle, ticking every 0.1 s, it asks for no block
    number; it still sees the blocks a job's commit makes and fixes its seed."""
    chain.deployment.save(tmp_path / "devnet" / "deployment.json")
    dev = 7
    log = tmp_path / "verifier.log"
    env = {**os.environ, "POLNET_HOME": str(tmp_path), "POLNET_RPC_URL": proxy.url,
           "POLNET_RPC__WS_URL": _ws(chain), "POLNET_STAKE": str(200 * TOKEN),
           "OMP_NUM_THREADS": "1", "POLNET_POLL_INTERVAL": "0.1"}
    with log.open("w") as out:
        p = subprocess.Popen([sys.executable, "-m", "node.cli.main", "verifier", "run",
                              "--name", "v", "--dev-account", str(dev)], cwd=ROOT, env=env,
                             stdout=out, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)

    def alive() -> bool:
        assert p.poll() is None, f"the daemon exited ({p.returncode}):\n{log.read_text()[-4000:]}"
        return True

    try:
        _until(lambda: alive() and "verifier_running" in log.read_text(), "the verifier",
               timeout=180)
        chain.mine(1)  # a first pushed head (a subscription hears only blocks after it)
        time.sleep(1.0)
        calls = proxy.methods["eth_blockNumber"]
        time.sleep(3.0)  # 30 ticks
        alive()
        assert proxy.methods["eth_blockNumber"] - calls <= 1  # over HTTP: one per tick

        solver = chain.join(1, SOLVER, 500 * TOKEN)
        jid = chain[5].post_job(job_terms())
        solver.market.claim_job(jid)
        fl, ft = fake_trace(jid, 12, 5, tag="fake")
        solver.market.commit_trace(jid, fl, ft)
        m = chain.reader.market
        chain.mine(max(1, m.get_job(jid).sample_block - chain.w3.eth.block_number + 1))
        _until(lambda: alive() and m.get_job(jid).seed != bytes(32), "the seed", timeout=120)
        assert m.get_job(jid).status == JobStatus.COMMITTED
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
