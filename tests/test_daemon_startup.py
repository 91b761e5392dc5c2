"""A daemon's start-up on a sick RPC node: a real `polnet verifier run` process behind
the throttling proxy (devnet/rpcproxy.py) in front of a real anvil. Node errors (-32603
"internal error") while it connects and registers are retried with the RPC layer's
backoff; an error a person must fix ends it at once, in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from devnet.params import TOKEN
from devnet.rpcproxy import RpcProxy
from devnet.testing import LocalChain

ROOT = Path(__file__).resolve().parents[1]


def _verifier(tmp_path: Path, proxy: RpcProxy, dev: int, stake: int,
              log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "POLNET_HOME": str(tmp_path), "POLNET_RPC_URL": proxy.url,
           "POLNET_RPC__TIMEOUT": "2", "POLNET_RPC__RETRIES": "3",
           "POLNET_RPC__BACKOFF": "0.05", "POLNET_RPC__MAX_BACKOFF": "0.2",
           "POLNET_STAKE": str(stake), "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "node.cli.main", "verifier", "run",
                                 "--name", "v", "--dev-account", str(dev)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def test_a_verifier_registers_through_internal_errors_and_keeps_running(
        chain: LocalChain, proxy: RpcProxy, tmp_path: Path) -> None:
    """Before the fix the first -32603 "internal error" answered to the registration's
    gas estimate became TransactionFailed inside `ensure_registered`, before the run
    loop started, and the process exited with it (as did one answered to the chain id
    while connecting). Now each start-up step is retried with backoff: the daemon
    connects, registers, stakes, reaches its loop and stays up."""
    chain.deployment.save(tmp_path / "devnet" / "deployment.json")
    proxy.fail_next("eth_chainId", 2)  # connecting
    proxy.fail_next("eth_estimateGas", 3)  # the registration's simulation
    proxy.fail_next("eth_sendRawTransaction", 2)  # and then its send
    dev = 7
    log = tmp_path / "verifier.log"
    p = _verifier(tmp_path, proxy, dev, 200 * TOKEN, log)
    try:
        for _ in range(400):
            if "verifier_running" in log.read_text() or p.poll() is not None:
                break
            time.sleep(0.5)
        text = log.read_text()
        assert p.poll() is None, f"the daemon exited ({p.returncode}):\n{text[-4000:]}"
        assert "verifier_running" in text, text[-4000:]
        assert proxy.counts["-32603"] == 7  # every planned failure was met
        assert text.count("startup_retry") == 7, text[-4000:]
        info = chain.reader.registry.node_of(chain.addresses[dev])
        assert info.registered and info.free_stake + info.locked_stake == 200 * TOKEN
        assert json.loads(info.profile)["name"] == "v"  # the explorer shows it by name
        time.sleep(3)  # and it keeps running
        assert p.poll() is None, log.read_text()[-4000:]
    finally:
        _stop(p)


def test_an_error_a_person_must_fix_ends_start_up_at_once(
        chain: LocalChain, proxy: RpcProxy, tmp_path: Path) -> None:
    """Retries must not hide what no retry fixes: a stake larger than the account's
    POL ends the daemon at once with one line saying how much is missing and what to
    change (it was the token's raw ERC20InsufficientBalance revert)."""
    chain.deployment.save(tmp_path / "devnet" / "deployment.json")
    log = tmp_path / "verifier.log"
    p = _verifier(tmp_path, proxy, 7, 10**12 * TOKEN, log)
    try:
        p.wait(300)
    finally:
        _stop(p)
    text = log.read_text()
    assert p.returncode == 1, text[-4000:]
    assert "startup_retry" not in text and "Traceback" not in text, text[-4000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("error: ") and "POLNET_STAKE" in last and "more" in last, last


def test_node_failures_are_told_from_what_a_person_must_fix() -> None:
    """The classification start-up retries by: the RPC node's own errors are retried;
    a revert, no gas money, bad configuration and an RPC already given up on are not."""
    from web3.exceptions import ContractLogicError, Web3RPCError

    from node.chain.rpc import node_failure
    from node.errors import ConfigError, ContractRevert, RpcUnavailable, TransactionFailed

    assert node_failure(TransactionFailed("transaction rejected by the node: internal error"))
    assert node_failure(TransactionFailed("simulation failed: internal error"))
    assert node_failure(Web3RPCError("internal error"))
    assert node_failure(ConnectionResetError())
    assert not node_failure(ContractRevert("InsufficientStake"))
    assert not node_failure(ContractLogicError("execution reverted"))
    assert not node_failure(TransactionFailed("simulation failed: insufficient funds for gas"))
    assert not node_failure(ConfigError("the node is on chain 1, the profile says 31337"))
    assert not node_failure(RpcUnavailable("cannot reach the chain"))
