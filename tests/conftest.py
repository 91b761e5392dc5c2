"""Shared chain fixtures: one anvil + one deployment per test session; each test
runs inside an anvil snapshot that is reverted afterwards.

- ``anvil``: a bare anvil on a free 127.0.0.1 port (session).
- ``deployed``: the Deployment of all contracts with 10 funded dev accounts (session).
- ``chain``: a :class:`devnet.testing.LocalChain` over it, state reverted after the test.
- ``module_deployment``: the requesting module's own contracts, deployed with its
  ``PARAMS`` on the session anvil, everything reverted after the module (module).
- ``module_chain``: that deployment, its state reverted after each test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from devnet.anvil import AnvilProcess, dev_accounts, start_anvil
from devnet.deploy import deploy_all
from devnet.hardhat import start_hardhat
from devnet.params import DevnetParams
from devnet.rpcproxy import RpcProxy
from devnet.testing import LocalChain, artifacts_missing, own_deployment
from node.chain.deployment import Deployment
from node.chain.rpc import make_web3

N_ACCOUNTS = 10


def _skip_without_artifacts() -> None:
    missing = artifacts_missing()
    if missing:
        pytest.skip(f"contract artifacts missing ({', '.join(missing)}): run `make contracts`")


@pytest.fixture(scope="session")
def anvil(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnvilProcess]:
    """The session's chain: anvil, or a Hardhat Network node with ``POLNET_EVM=hardhat``
    (tests/test_second_evm.py runs the contract tests that way)."""
    log = tmp_path_factory.mktemp("anvil") / "anvil.log"  # kept by pytest for post-mortems
    evm = os.environ.get("POLNET_EVM", "anvil")
    if evm not in ("anvil", "hardhat"):
        raise pytest.UsageError(f"POLNET_EVM={evm!r}: use anvil (default) or hardhat")
    node = start_hardhat(accounts=N_ACCOUNTS, log_path=log) if evm == "hardhat" else \
        start_anvil(accounts=N_ACCOUNTS, log_path=log)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def devnet_params() -> DevnetParams:
    return DevnetParams(accounts=N_ACCOUNTS)


@pytest.fixture(scope="session")
def deployed(anvil: AnvilProcess, devnet_params: DevnetParams) -> Deployment:
    _skip_without_artifacts()
    accts = dev_accounts(N_ACCOUNTS)
    return deploy_all(make_web3(anvil.url), accts[0], devnet_params, fund=accts,
                      rpc_url=anvil.url)


@pytest.fixture(scope="session")
def _session_chain(anvil: AnvilProcess, deployed: Deployment) -> LocalChain:
    return LocalChain(anvil, deployed)


@pytest.fixture
def chain(_session_chain: LocalChain) -> Iterator[LocalChain]:
    with _session_chain.reverting() as c:
        yield c


@pytest.fixture
def proxy(chain: LocalChain) -> Iterator[RpcProxy]:
    """The counting (and, when told, throttling) RPC proxy in front of ``chain``."""
    p = RpcProxy(chain.url).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def module_deployment(anvil: AnvilProcess, request: pytest.FixtureRequest) -> Iterator[LocalChain]:
    """Own contracts on the session anvil, deployed (by dev account 0) with the requesting
    module's ``PARAMS``, reverted after the module."""
    _skip_without_artifacts()
    with own_deployment(anvil, request.module.PARAMS) as c:
        yield c


@pytest.fixture
def module_chain(module_deployment: LocalChain) -> Iterator[LocalChain]:
    """The module's own deployment, its state reverted after each test."""
    with module_deployment.reverting() as c:
        yield c
