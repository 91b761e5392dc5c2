"""The typed chain client: connection, transactions, contract bindings, events.

Daemons use:

- :class:`ChainClient` (``ChainClient.from_deployment(account=...)``): ``.token``,
  ``.registry``, ``.market``, ``.dispute`` typed facades; ``.stake()``, ``.post_job()``;
- :class:`EventWatcher`: exactly-once, restart-safe event delivery;
- :class:`Deployment`: the deployment file written by ``polnet devnet up``.

Reverts surface as :class:`node.errors.ContractRevert` with the custom error's name
and decoded arguments; an unreachable node as :class:`node.errors.RpcUnavailable`.
"""

from node.boundary import pin_recursion_limit
from node.chain.bound import Bound, batch_call
from node.chain.client import ChainClient
from node.chain.contracts import (
    SOLVER,
    VERIFIER,
    DisputeState,
    Job,
    JobStatus,
    MarketParamsView,
    NodeInfo,
    Phase,
    Side,
    vote_commitment,
)
from node.chain.deployment import Deployment, default_deployment_path
from node.chain.events import ChainEvent, EventWatcher

pin_recursion_limit()  # web3 -> py_ecc raised it to 100000: deep recursion would SIGSEGV

__all__ = ["SOLVER", "VERIFIER", "Bound", "ChainClient", "ChainEvent", "Deployment",
           "DisputeState", "EventWatcher", "Job", "JobStatus", "MarketParamsView", "NodeInfo",
           "Phase", "Side", "batch_call", "default_deployment_path", "vote_commitment"]
