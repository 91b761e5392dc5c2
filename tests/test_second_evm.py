"""polnet on a second, independent EVM implementation: a Hardhat Network node (EDR).

- the contract tests (market, registry, dispute game, the settlement attacks, the chain
  client) run unchanged against Hardhat (``POLNET_EVM=hardhat``);
- `polnet deploy --network NAME` with a keystore deploys onto it from a network profile,
  and cast (Foundry's CLI, not our client) checks what landed;
- one whole job with real daemons (solver, three verifiers, submitter) settles on it,
  its payout and events checked with cast.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devnet.anvil import REPO, AnvilProcess, dev_accounts, free_port
from devnet.hardhat import HARDHAT_CHAIN_ID, start_hardhat
from devnet.localnet import LocalNet
from devnet.params import TOKEN, short_network_params
from devnet.testing import set_balance
from node.chain.rpc import make_web3
from node.demo import pack_inputs, spec_for

CAST = REPO / "node_modules" / ".bin" / "cast"
PASSWORD = "correct horse battery staple"
pytestmark = pytest.mark.timeout(600)


def cast(*args: str) -> str:
    out = subprocess.run([str(CAST), *args], capture_output=True, text=True, timeout=60)
    # cast 1.7 exits 0 on some RPC errors: its stderr says so
    assert out.returncode == 0 and "Error" not in out.stderr, out.stderr
    return out.stdout.strip()


def cast_call(rpc_url: str, to: str, sig: str, *args: str) -> str:
    """``cast call`` done as cast calldata -> raw eth_call -> cast abi-decode: cast 1.7's
    eth_call sends both ``input`` and ``data``, which Hardhat's EDR refuses as a duplicate."""
    data = cast("calldata", sig.split(")(")[0] + ")", *args)
    req = json.dumps([{"to": to, "data": data}, "latest"])
    raw = json.loads(cast("rpc", "--raw", "--rpc-url", rpc_url, "eth_call", req))
    return cast("abi-decode", sig, raw).split()[0]


def polnet(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POLNET_HOME": str(home), "POLNET_KEYSTORE_PASSWORD": PASSWORD}
    return subprocess.run([sys.executable, "-m", "node.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def hardhat(tmp_path: Path) -> Iterator[AnvilProcess]:
    node = start_hardhat(accounts=10, log_path=tmp_path / "hardhat.log")
    try:
        yield node
    finally:
        node.stop()


@pytest.mark.parallel
def test_contract_tests_pass_on_hardhat() -> None:
    modules = ["tests/test_market.py", "tests/test_registry.py", "tests/test_dispute_game.py",
               "tests/test_settlement_attacks.py", "tests/test_chain_client.py",
               "tests/test_chain_events.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *modules], cwd=REPO, env={**os.environ, "POLNET_EVM": "hardhat"},
                         capture_output=True, text=True, timeout=900)
    tail = out.stdout[-3000:]
    assert out.returncode == 0, tail
    m = re.search(r"(\d+) passed", tail)
    assert m and int(m.group(1)) >= 70 and "skipped" not in tail, tail


def test_deploy_with_a_keystore_from_a_network_profile(hardhat: AnvilProcess,
                                                        tmp_path: Path) -> None:
    home = tmp_path / "home"
    ks = tmp_path / "owner.json"
    made = polnet(home, "key", "new", "--out", str(ks))
    assert made.returncode == 0, made.stderr
    owner = made.stdout.strip()
    assert oct(ks.stat().st_mode & 0o777) == "0o600"
    assert polnet(home, "key", "new", "--out", str(ks)).returncode == 1  # never overwritten
    set_balance(make_web3(hardhat.url), owner, 10**21)  # gas for the owner
    dep_file = tmp_path / "hh-deployment.json"
    cfg = tmp_path / "net.toml"
    cfg.write_text(f'[networks.hh]\nrpc_url = "{hardhat.url}"\nchain_id = {HARDHAT_CHAIN_ID}\n'
                   f'deployment = "{dep_file}"\n'
                   f'[networks.wrong]\nrpc_url = "{hardhat.url}"\nchain_id = 1\n'
                   f'deployment = "{tmp_path / "w.json"}"\n')
    user = dev_accounts(2)[1].address

    bad = polnet(home, "deploy", "--network", "wrong", "--config", str(cfg), "--keystore", str(ks))
    assert bad.returncode == 1 and "is chain 31338, network wrong says 1" in bad.stderr
    bad = polnet(home, "deploy", "--network", "nope", "--config", str(cfg), "--keystore", str(ks))
    assert bad.returncode == 1 and "[networks.nope]" in bad.stderr
    bad = polnet(home, "deploy", "--network", "hh", "--config", str(cfg))
    assert bad.returncode == 1 and "--keystore" in bad.stderr and not dep_file.exists()

    out = polnet(home, "deploy", "--network", "hh", "--config", str(cfg), "--keystore", str(ks),
                 "--mint", f"{user}=1000.5")
    assert out.returncode == 0, out.stderr
    assert f"minted 1000.5 POL to {user}" in out.stdout
    dep = json.loads(dep_file.read_text())
    assert dep["chain_id"] == HARDHAT_CHAIN_ID and dep["accounts"] == []  # no keys in it
    again = polnet(home, "deploy", "--network", "hh", "--config", str(cfg), "--keystore", str(ks))
    assert again.returncode == 1 and "--force" in again.stderr

    # Foundry's cast, not our client, reads what landed.
    rpc = ["--rpc-url", hardhat.url]
    assert cast("chain-id", *rpc) == str(HARDHAT_CHAIN_ID)
    token, market = dep["contracts"]["PolToken"], dep["contracts"]["JobMarket"]
    for addr in dep["contracts"].values():
        assert len(cast("code", addr, *rpc)) > 1000
    assert cast_call(hardhat.url, token, "owner()(address)").lower() == owner.lower()
    assert cast_call(hardhat.url, token, "balanceOf(address)(uint256)", user) == \
        str(10005 * TOKEN // 10)
    assert cast_call(hardhat.url, market, "disputeGame()(address)").lower() == \
        dep["contracts"]["DisputeGame"].lower()

    # Every command reads the profile: --network picks it.
    st = polnet(home, "--network", "hh", "job", "list", "--config", str(cfg))
    assert st.returncode == 0, st.stderr
    missing = polnet(home, "--network", "hh", "job", "status", "1", "--config", str(cfg))
    assert missing.returncode == 1 and "no job 1" in missing.stderr


@pytest.mark.parallel
def test_a_whole_job_with_real_daemons_settles_on_hardhat(tmp_path: Path) -> None:
    inputs = pack_inputs(tmp_path / "data")
    digest = hashlib.sha256(inputs["digits"].read_bytes()).hexdigest()
    spec = spec_for("mlp_digits.toml", digest, tmp_path / "data" / "job.toml", total_steps=40)
    with LocalNet(tmp_path / "net", short_network_params(), evm="hardhat") as net:
        assert "hardhat" in net.c.w3.client_version.lower()
        for name, acct in (("v1", 4), ("v2", 5), ("v3", 6)):
            net.start_verifier(name, acct)
        net.start_solver("honest", 2)
        solver = net.address(2)
        job = net.submit("sub", 1, spec, inputs["digits"])
        net.wait_job(job, {3}, 300)  # Finalized
        reward = net.c.market.get_job(job).reward
        rpc = ["--rpc-url", net.c.rpc_url]
        market, token = net.c.market.address, net.c.token.address
        logs = cast("logs", "--from-block", "0", "--address", market,
                    "JobFinalized(uint256 indexed,address indexed,uint256,uint32,uint256)",
                    *rpc)
        assert logs.count("transactionHash") == 1, logs
        deadline = time.monotonic() + 120  # the solver withdraws its reward (bounded wait)
        while net.c.market.credits(solver) and time.monotonic() < deadline:
            time.sleep(1)
        assert net.c.market.credits(solver) == 0
        held = int(cast_call(net.c.rpc_url, token, "balanceOf(address)(uint256)", solver))
        assert held == net.c.token.balance_of(solver)  # cast and our client agree
        assert net.holdings(solver) >= reward
        assert net.conserved(), net.books()


def test_devnet_up_hardhat_works_from_another_directory(tmp_path: Path) -> None:
    """`polnet devnet up --evm hardhat` typed outside the clone died in stack frames
    (Hardhat's HH12, 'non-local installation', hidden in a log named anvil.log)."""
    env = {**os.environ, "POLNET_HOME": str(tmp_path / "home")}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def polnet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "node.cli.main", *args], cwd=elsewhere,
                              env=env, capture_output=True, text=True, timeout=300)

    up = polnet("devnet", "up", "--evm", "hardhat", "--port", str(free_port()))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert (tmp_path / "home" / "devnet" / "hardhat.log").is_file()
        assert not (tmp_path / "home" / "devnet" / "anvil.log").exists()
    finally:
        polnet("devnet", "down")
