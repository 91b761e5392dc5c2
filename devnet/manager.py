"""`polnet devnet up/down/status` as a Python API: a background anvil with the
contracts deployed, tracked by files under ``$POLNET_HOME/devnet/``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from devnet.anvil import AnvilProcess, dev_accounts, pid_alive, port_in_use, start_anvil
from devnet.deploy import deploy_all
from devnet.hardhat import start_hardhat
from devnet.params import DevnetParams
from node.chain.deployment import Deployment, polnet_home
from node.chain.rpc import make_web3
from node.errors import DeploymentNotFound, DevnetError, PolnetError

DEFAULT_PORT = 8545


def devnet_dir(home: Path | None = None) -> Path:
    return (home or polnet_home()) / "devnet"


def _pid_file(home: Path | None) -> Path:
    return devnet_dir(home) / "anvil.pid"


def running(home: Path | None = None) -> AnvilProcess | None:
    """The devnet's anvil if its pid file names a live process."""
    pf = _pid_file(home)
    try:
        info = json.loads(pf.read_text())
    except (OSError, ValueError):
        return None
    if not pid_alive(int(info["pid"])):
        return None
    return AnvilProcess(port=int(info["port"]), pid=int(info["pid"]),
                        log_path=devnet_dir(home) / f"{info.get('evm', 'anvil')}.log")


EVMS = ("anvil", "hardhat")


def start(port: int = DEFAULT_PORT, accounts: int = 10, block_time: float | None = None,
          params: DevnetParams | None = None, home: Path | None = None,
          evm: str = "anvil") -> Deployment:
    """Start a local chain in the background (anvil, or a Hardhat Network node with
    ``evm="hardhat"``), deploy everything, write the deployment file."""
    if evm not in EVMS:
        raise DevnetError(f"unknown EVM {evm!r}: use one of {', '.join(EVMS)}")
    existing = running(home)
    if existing is not None:
        raise DevnetError(f"the devnet is already running (pid {existing.pid}, "
                          f"{existing.url}): run `polnet devnet down` first")
    if port_in_use(port):
        raise DevnetError(f"port {port} on 127.0.0.1 is already in use: stop whatever "
                          f"listens there or use `polnet devnet up --port N`")
    params = (params or DevnetParams()).model_copy(update={"accounts": accounts})
    d = devnet_dir(home)
    d.mkdir(parents=True, exist_ok=True)
    log_path = d / f"{evm}.log"  # named after the chain it logs
    log_path.unlink(missing_ok=True)  # a fresh log per run, created 0600 by spawn_chain
    start_node = start_hardhat if evm == "hardhat" else start_anvil
    node = start_node(port, accounts=accounts, block_time=block_time, log_path=log_path,
                      detach=True)
    _pid_file(home).write_text(json.dumps({"pid": node.pid, "port": node.port, "evm": evm}))
    try:
        accts = dev_accounts(accounts)
        dep = deploy_all(make_web3(node.url), accts[0], params, fund=accts, rpc_url=node.url)
        dep.save(d / "deployment.json")
    except BaseException:
        node.stop()
        _pid_file(home).unlink(missing_ok=True)
        raise
    return dep


def stop(home: Path | None = None) -> bool:
    """Stop the devnet; False if it was not running. The deployment file goes too:
    its addresses would be wrong on the next chain."""
    node = running(home)
    _pid_file(home).unlink(missing_ok=True)
    (devnet_dir(home) / "deployment.json").unlink(missing_ok=True)
    if node is None:
        return False
    node.stop()
    return True


@dataclass
class ContractStatus:
    name: str
    address: str
    has_code: bool
    token_balance: int | None = None


@dataclass
class DevnetStatus:
    running: bool
    pid: int | None = None
    rpc_url: str | None = None
    block: int | None = None
    chain_id: int | None = None
    contracts: list[ContractStatus] = field(default_factory=list)
    accounts: list[tuple[str, int, int]] = field(default_factory=list)  # address, ETH, POL
    problem: str | None = None


def status(home: Path | None = None) -> DevnetStatus:
    """Is it up, its head block, each contract with a code check, balances."""
    node = running(home)
    if node is None:
        return DevnetStatus(running=False, problem="not running: `polnet devnet up`")
    st = DevnetStatus(running=True, pid=node.pid, rpc_url=node.url)
    try:
        dep = Deployment.load(devnet_dir(home) / "deployment.json")
    except DeploymentNotFound as exc:
        st.problem = str(exc)
        return st
    from node.chain.client import ChainClient  # noqa: PLC0415

    try:
        client = ChainClient(dep.rpc_url, None, dep)
        st.block, st.chain_id = client.block_number(), client.chain_id
        token = client.token
        for name, addr in dep.contracts.items():
            code = client.w3.eth.get_code(addr)  # type: ignore[arg-type]
            bal = int(token.balanceOf(addr)) if len(code) else None
            st.contracts.append(ContractStatus(name, addr, len(code) > 0, bal))
        for a in dep.accounts:
            st.accounts.append((a.address, client.eth_balance(a.address),
                                int(token.balanceOf(a.address))))
    except PolnetError as exc:
        st.problem = str(exc)
    return st


def fund(address: str, pol: int, eth: int, home: Path | None = None) -> tuple[int, int]:
    """Give ``address`` ``pol`` POL (minted by the deployer, who owns the devnet's token)
    and ``eth`` more wei of gas money; returns its (ETH, POL) balances after."""
    from eth_utils import is_address, to_checksum_address  # noqa: PLC0415

    from devnet.hardhat import kind  # noqa: PLC0415
    from node.chain.client import ChainClient  # noqa: PLC0415

    if not is_address(address):
        raise DevnetError(f"{address!r} is not an address: pass 0x followed by 40 hex digits")
    addr = to_checksum_address(address)
    if running(home) is None:
        raise DevnetError("the devnet is not running: `polnet devnet up` first")
    dep = Deployment.load(devnet_dir(home) / "deployment.json")
    owner = ChainClient.from_deployment(dep, 0)  # the deployer owns the token
    if pol:
        owner.token.mint_to(addr, pol)
    if eth:
        # A dev chain's own call (anvil_ / hardhat_setBalance): no account pays for it.
        new = owner.eth_balance(addr) + eth
        resp = owner.w3.provider.make_request(f"{kind(owner.w3)}_setBalance",  # type: ignore[arg-type]
                                              [addr, hex(new)])
        if "error" in resp:
            raise DevnetError(f"setBalance failed: {resp['error']}")
    return owner.eth_balance(addr), int(owner.token.balanceOf(addr))
