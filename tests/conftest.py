"""Shared chain fixtures: one anvil + one deployment per test session; each test
runs inside an anvil snapshot that is reverted afterwards.

- ``anvil``: a bare anvil on a free 127.0.0.1 port (session).
- ``deployed``: the Deployment of all contracts with 10 funded dev accounts (session).
- ``chain``: a :class:`devnet.testing.LocalChain` over it, state reverted after the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devnet.anvil import AnvilProcess, dev_accounts, start_anvil
from devnet.deploy import CONTRACTS, deploy_all
from devnet.params import DevnetParams
from devnet.testing import LocalChain
from node.chain.artifacts import artifacts_dir
from node.chain.deployment import Deployment
from node.chain.rpc import make_web3

N_ACCOUNTS = 10


def _artifacts_missing() -> list[str]:
    d = artifacts_dir()
    return [n for n in CONTRACTS if not (d / f"{n}.json").is_file()]


@pytest.fixture(scope="session")
def anvil(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnvilProcess]:
    log = tmp_path_factory.mktemp("anvil") / "anvil.log"  # kept by pytest for post-mortems
    node = start_anvil(accounts=N_ACCOUNTS, log_path=log)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def devnet_params() -> DevnetParams:
    return DevnetParams(accounts=N_ACCOUNTS)


@pytest.fixture(scope="session")
def deployed(anvil: AnvilProcess, devnet_params: DevnetParams) -> Deployment:
    missing = _artifacts_missing()
    if missing:
        pytest.skip(f"contract artifacts missing ({', '.join(missing)}): run `make contracts`")
    accts = dev_accounts(N_ACCOUNTS)
    return deploy_all(make_web3(anvil.url), accts[0], devnet_params, fund=accts,
                      rpc_url=anvil.url)


@pytest.fixture(scope="session")
def _session_chain(anvil: AnvilProcess, deployed: Deployment) -> LocalChain:
    return LocalChain(anvil, deployed)


@pytest.fixture
def chain(_session_chain: LocalChain) -> Iterator[LocalChain]:
    snap = _session_chain.snapshot()
    try:
        yield _session_chain
    finally:
        _session_chain.revert(snap)
