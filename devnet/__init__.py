"""The local devnet: anvil plus the polnet contracts, for demos and tests.

Python API: :func:`start` / :func:`stop` / :func:`status` (what the CLI runs),
:func:`deploy_all` (deploy onto any Web3), :func:`start_anvil` (a bare chain)
and :class:`DevnetParams` (every deployment parameter, one place).
"""

from devnet.anvil import AnvilProcess, dev_accounts, free_port, start_anvil
from devnet.deploy import deploy_all
from devnet.manager import DevnetStatus, running, start, status, stop
from devnet.params import DevnetParams, DisputeParams, MarketParams, RegistryParams

__all__ = ["AnvilProcess", "DevnetParams", "DevnetStatus", "DisputeParams", "MarketParams",
           "RegistryParams", "deploy_all", "dev_accounts", "free_port", "running", "start",
           "start_anvil", "status", "stop"]
