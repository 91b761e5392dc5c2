"""The RPC layer on a throttling provider (issue 31): a real anvil behind a real HTTP
proxy (devnet/rpcproxy.py) that answers 429, -32005 and "header not found", stalls
and resets a fraction of requests. Reads and a transaction get through; when the
retries run out the error is RpcUnavailable; a real verifier daemon process lives
through a burst of 429s and then does its job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devnet.params import TOKEN
from devnet.rpcproxy import RpcProxy, Throttle
from devnet.testing import LocalChain, fake_trace, job_terms
from node.chain.client import ChainClient
from node.chain.contracts import SOLVER, JobStatus
from node.chain.rpc import RpcSettings
from node.errors import RpcUnavailable

ROOT = Path(__file__).resolve().parents[1]
FAST = RpcSettings(timeout=0.5, retries=12, backoff=0.01, max_backoff=0.05)


def test_reads_and_a_transaction_get_through_a_throttling_provider(
        chain: LocalChain, proxy: RpcProxy) -> None:
    """Before the fix the first 429 ended the call with requests' HTTPError (an OSError
    no caller handled), and -32005 was a Web3RPCError: no read survived this proxy. The
    transfer also shows a send whose answer was lost (a stall past the client's timeout,
    executed upstream anyway) is not sent twice."""
    proxy.throttle = Throttle(p429=0.2, p32005=0.15, p_header=0.05, p_stall=0.1, p_reset=0.05,
                              stall_s=1.0, seed=7)
    c = ChainClient(proxy.url, chain.accounts[3], chain.deployment, rpc=FAST)
    truth = chain.reader
    for _ in range(15):
        assert c.block_number() == truth.block_number()
        assert c.market.job_count() == truth.market.job_count()
    to = chain.addresses[4]
    before = truth.token.balance_of(to)
    for _ in range(3):
        c.token.transfer(to, 7 * TOKEN)
    assert truth.token.balance_of(to) == before + 21 * TOKEN  # each once, none twice
    assert proxy.methods["eth_sendRawTransaction"] >= 3
    for kind in ("429", "-32005", "-32000", "stall", "reset", "forward"):
        assert proxy.counts[kind] > 0, (kind, proxy.counts)  # the test saw each failure


@pytest.mark.parametrize("throttle", [Throttle(p429=1.0), Throttle(p32005=1.0),
                                      Throttle(p_header=1.0),
                                      Throttle(p_stall=1.0, stall_s=1.0),
                                      Throttle(p_reset=1.0)],
                         ids=["429", "-32005", "header-not-found", "stall", "reset"])
def test_exhausted_retries_are_rpc_unavailable(chain: LocalChain, proxy: RpcProxy,
                                               throttle: Throttle) -> None:
    """Each way a provider refuses ends, after the retries, in RpcUnavailable (a
    PolnetError naming the fix), never in a requests or web3 exception."""
    c = ChainClient(chain.url, None, chain.deployment)
    c.w3 = ChainClient(proxy.url, None, chain.deployment, rpc=FAST).w3
    proxy.throttle = throttle
    with pytest.raises(RpcUnavailable, match=r"\[rpc\] rate"):
        c.market.job_count()
    assert proxy.counts["total"] >= FAST.retries + 1


def test_request_budget_spreads_requests(chain: LocalChain, proxy: RpcProxy) -> None:
    """[rpc] rate caps the requests a node sends per second (a provider's allowance):
    in any one second the proxy sees at most one second's burst plus one second's rate."""
    rate = 10.0
    c = ChainClient(proxy.url, None, chain.deployment, rpc=RpcSettings(rate=rate))
    for _ in range(35):
        c.block_number()
    t = proxy.arrivals
    assert len(t) >= 35
    worst = max(sum(1 for b in t if a <= b < a + 1.0) for a in t)
    assert worst <= 2 * rate, f"{worst} requests in one second at rate {rate}"


def test_rpc_section_from_file_and_environment_reaches_the_provider(
        chain: LocalChain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[rpc] in the config file and POLNET_RPC__* in the environment are the settings
    the node's provider runs with; a bad value is named."""
    from node.chain.rpc import ResilientHTTPProvider
    from node.config import load_config
    from node.errors import ConfigError

    cfg = tmp_path / "node.toml"
    cfg.write_text("[rpc]\nrate = 5\nretries = 2\n")
    monkeypatch.setenv("POLNET_RPC__TIMEOUT", "3")
    s = load_config(cfg)
    assert (s.rpc.rate, s.rpc.retries, s.rpc.timeout) == (5.0, 2, 3.0)
    provider = ChainClient(chain.url, None, chain.deployment, rpc=s.rpc).w3.provider
    assert isinstance(provider, ResilientHTTPProvider)
    assert provider.settings == s.rpc and provider.budget.rate == 5.0
    cfg.write_text("[rpc]\nrate = -1\n")
    with pytest.raises(ConfigError, match="rpc.rate"):
        load_config(cfg)


def _alive(p: subprocess.Popen[str], log: Path) -> None:
    assert p.poll() is None, f"the daemon exited ({p.returncode}):\n{log.read_text()[-4000:]}"


def test_a_verifier_daemon_lives_through_a_burst_of_429s_and_does_its_job(
        chain: LocalChain, proxy: RpcProxy, tmp_path: Path) -> None:
    """Before the fix a throttled provider's 429 stopped a daemon: the HTTPError was not
    a PolnetError, so the verifier's run loop let it through and the process exited.
    Here a real `polnet verifier run` reaches anvil only through the proxy: it starts
    and registers through 429s, -32005s, stalls and resets, outlives a burst of 429s
    (then "internal error" answers, which no retry hides) with its loop running, and
    then fixes the seed of a job committed after the burst (its first duty to a
    committed job)."""
    proxy.throttle = Throttle(p429=0.15, p32005=0.1, p_stall=0.03, p_reset=0.03,
                              stall_s=1.5, seed=3)
    chain.deployment.save(tmp_path / "devnet" / "deployment.json")
    dev = 7
    me = chain.addresses[dev]
    log = tmp_path / "verifier.log"
    env = {**os.environ, "POLNET_HOME": str(tmp_path), "POLNET_RPC_URL": proxy.url,
           "POLNET_RPC__TIMEOUT": "1", "POLNET_RPC__RETRIES": "3",
           "POLNET_RPC__BACKOFF": "0.05", "POLNET_RPC__MAX_BACKOFF": "0.2",
           "POLNET_STAKE": str(200 * TOKEN), "OMP_NUM_THREADS": "1",
           # The chain view makes one request a tick while no block arrives: tick often,
           # so the bursts below are spent in seconds.
           "POLNET_POLL_INTERVAL": "0.1"}
    with log.open("w") as out:
        p = subprocess.Popen([sys.executable, "-m", "node.cli.main", "verifier", "run",
                              "--name", "v", "--dev-account", str(dev)], cwd=ROOT, env=env,
                             stdout=out, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        reg = chain.reader.registry
        for _ in range(400):  # started: registered, staked and in its loop, through it all
            if "verifier_running" in log.read_text():
                break
            _alive(p, log)
            time.sleep(0.5)
        assert "verifier_running" in log.read_text(), log.read_text()[-4000:]
        assert reg.node_of(me).free_stake > 0

        # A burst: every request answered 429, then "internal error" for a while.
        proxy.burst(60)
        for _ in range(600):
            if proxy.burst_left() == 0:
                break
            _alive(p, log)
            time.sleep(0.2)
        assert proxy.burst_left() == 0
        proxy.throttle = Throttle(p_internal=0.5, seed=4)
        seen = proxy.counts["-32603"]
        for _ in range(600):
            if proxy.counts["-32603"] >= seen + 10:
                break
            _alive(p, log)
            time.sleep(0.2)
        _alive(p, log)
        proxy.throttle = Throttle(p429=0.15, p32005=0.1, seed=5)

        # Its job: a job committed now gets its seed fixed by the daemon.
        solver = chain.join(1, SOLVER, 500 * TOKEN)
        jid = chain[5].post_job(job_terms())
        solver.market.claim_job(jid)
        fl, ft = fake_trace(jid, 12, 5, tag="fake")
        solver.market.commit_trace(jid, fl, ft)
        m = chain.reader.market
        chain.mine(max(1, m.get_job(jid).sample_block - chain.w3.eth.block_number + 1))
        for _ in range(600):
            if m.get_job(jid).seed != bytes(32):
                break
            _alive(p, log)
            time.sleep(0.3)
        job = m.get_job(jid)
        assert job.seed != bytes(32) and job.status == JobStatus.COMMITTED
        _alive(p, log)
        text = log.read_text()
        assert "verifier_tick_rpc_failed" in text  # the loop met the node's errors, lived on
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def test_a_send_whose_answer_was_lost_lands_once(chain: LocalChain, proxy: RpcProxy) -> None:
    """The provider takes a transaction but its answer never comes (the client times out;
    the proxy forwards the send to anvil afterwards, where it is mined). A blind retry
    of the raw transaction gets "nonce too low", and the sender's nonce resync then
    signed the transfer again under a new nonce: paid twice. The retry now looks the
    transaction up by its hash and takes it as sent."""
    proxy.throttle = Throttle(stall_s=0.6)
    slow_retry = RpcSettings(timeout=0.3, retries=3, backoff=2.0, max_backoff=3.0)
    c = ChainClient(proxy.url, chain.accounts[3], chain.deployment, rpc=slow_retry)
    to = chain.addresses[4]
    before = chain.reader.token.balance_of(to)
    proxy.stall_next("eth_sendRawTransaction")
    c.token.transfer(to, 5 * TOKEN)
    assert chain.reader.token.balance_of(to) == before + 5 * TOKEN  # not 10: sent once
    assert proxy.counts["stall"] == 1 and proxy.methods["eth_sendRawTransaction"] == 2
    c.token.transfer(to, 1 * TOKEN)  # and the local nonce is still right
    assert chain.reader.token.balance_of(to) == before + 6 * TOKEN


def test_a_collab_follower_behind_a_throttling_provider_posts_and_accepts(
        chain: LocalChain, proxy: RpcProxy, tmp_path: Path) -> None:
    """A collaborative job's round in its outer phase, nothing posted; the follower
    reaches the chain only through a proxy that answers 429 / -32005 to a third of
    requests. Looping as the daemons do (a failed pass is logged, the next one goes on),
    it posts the outer state it recomputes, accepts it once the window is over, and the
    job (one round) finishes: no exit, no move lost to a refused request."""
    import trio  # noqa: PLC0415

    from node.chain.contracts import CollabStatus  # noqa: PLC0415
    from node.chain.rpc import RPC_FAILURES  # noqa: PLC0415
    from node.errors import PolnetError  # noqa: PLC0415
    from tests.test_collab_market import make_net, outer, settled_one_round_job  # noqa: PLC0415
    from tests.test_collab_view import FOLLOWER, follower_runtime  # noqa: PLC0415

    net = make_net(chain)
    job = settled_one_round_job(net)
    reader = chain.reader.collab
    me = chain.addresses[FOLLOWER]
    failures: list[str] = []
    caught: tuple[type[BaseException], ...] = (PolnetError, *RPC_FAILURES)  # the daemons'

    async def main() -> None:
        async with follower_runtime(tmp_path, chain, proxy.url,
                                    RpcSettings(timeout=5, retries=12, backoff=0.01,
                                                max_backoff=0.05)) as (rt, f):
            proxy.throttle = Throttle(p429=0.2, p32005=0.15, seed=11)
            advanced = False
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    await f.tick(await rt.snapshot())
                except caught as exc:  # a failed pass is logged, as the daemons' loops do
                    failures.append(repr(exc))
                rnd = reader.get_round(job, 0)
                if rnd.accepted:
                    break
                if rnd.poster == me and not advanced:  # posted: let the window pass
                    chain.advance(reader.collab_params().outer_window)
                    advanced = True
                await trio.sleep(rt.settings.poll_interval)

    trio.run(main)
    rnd = reader.get_round(job, 0)
    assert rnd.poster == me and rnd.outer_hash == outer(0), failures
    assert rnd.accepted and reader.get_collab(job).status == CollabStatus.FINISHED, failures
    assert proxy.counts["429"] > 0 and proxy.counts["-32005"] > 0, proxy.counts
