"""ChainClient: one account's view of the chain and the polnet contracts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from web3 import Web3

from node.chain.artifacts import ErrorTable, artifacts_dir, load_artifact, load_error_table
from node.chain.bound import Bound
from node.chain.deployment import Deployment
from node.chain.ids import CollabId, JobId
from node.chain.rpc import RpcSettings, check_connected, make_web3, rpc_guard
from node.chain.tx import TxSender
from node.errors import ChainError, ConfigError

if TYPE_CHECKING:
    from node.chain.availability import Availability
    from node.chain.contracts import (
        Collab,
        CollabTerms,
        Dispute,
        JobTerms,
        Market,
        OuterJury,
        Registry,
        Token,
    )

B = TypeVar("B", bound=Bound)


def as_account(account: LocalAccount | str | None) -> LocalAccount | None:
    """A LocalAccount from one, or from a hex private key."""
    if account is None or isinstance(account, LocalAccount):
        return account
    try:
        acct: LocalAccount = Account.from_key(account)
    except Exception:  # noqa: BLE001 - never echo the bad key back
        raise ConfigError("the private key is not a valid 32-byte hex key") from None
    return acct


class ChainClient:
    """Connection + account + contract bindings.

    ``ChainClient(rpc_url, account)`` connects (raising RpcUnavailable with the fix
    if the node is down). With a ``deployment`` the polnet contracts are reachable
    as ``client.token``, ``.registry``, ``.market``, ``.dispute``, ``.collab``, ``.outer_jury``,
    ``.availability``.
    """

    def __init__(self, rpc_url: str, account: LocalAccount | str | None = None,
                 deployment: Deployment | None = None, *, artifacts: Path | None = None,
                 w3: Web3 | None = None, timeout: float | None = None,
                 rpc: RpcSettings | None = None,
                 expected_chain_id: int | None = None) -> None:
        self.rpc_url = rpc_url
        self.w3 = w3 or make_web3(rpc_url, timeout=timeout, settings=rpc)
        self.chain_id = check_connected(self.w3)
        if expected_chain_id is not None and expected_chain_id != self.chain_id:
            # A profile names its chain so that a wrong RPC URL never signs for another.
            raise ConfigError(f"the node at {rpc_url} is chain {self.chain_id}, but the "
                              f"network profile says chain_id = {expected_chain_id}: fix "
                              "the profile's rpc_url or chain_id")
        if deployment is not None and deployment.chain_id != self.chain_id:
            # Other contracts, or none, live at these addresses on this chain.
            raise ConfigError(f"the node at {rpc_url} is chain {self.chain_id}, but the "
                              f"deployment file is for chain {deployment.chain_id}: point "
                              "--rpc-url / the network profile at that chain, or use this "
                              "chain's deployment file (`polnet deploy --network NAME`)")
        self.deployment = deployment
        self.artifacts = artifacts or artifacts_dir()
        self.errors: ErrorTable = load_error_table(self.artifacts)
        acct = as_account(account)
        self.sender = TxSender(self.w3, acct, self.errors) if acct else None
        self._bound: dict[tuple[str, str], Bound] = {}

    @classmethod
    def from_deployment(cls, deployment: Deployment | Path | None = None,
                        account: LocalAccount | str | int | None = 0,
                        rpc_url: str | None = None,
                        expected_chain_id: int | None = None, rpc: RpcSettings | None = None
                        ) -> ChainClient:
        """Client for a deployment file; ``account`` may be a dev-account index."""
        dep = deployment if isinstance(deployment, Deployment) else Deployment.load(deployment)
        if isinstance(account, int):
            if not 0 <= account < len(dep.accounts):
                raise ConfigError(f"dev account {account} does not exist "
                                  f"(the deployment has {len(dep.accounts)})")
            account = dep.accounts[account].private_key
        return cls(rpc_url or dep.rpc_url, account, dep, rpc=rpc,
                   expected_chain_id=expected_chain_id)

    def with_account(self, account: LocalAccount | str) -> ChainClient:
        """Another account over the same connection and deployment."""
        clone = object.__new__(ChainClient)
        clone.__dict__.update(self.__dict__)
        clone.sender = TxSender(self.w3, as_account(account), self.errors)  # type: ignore[arg-type]
        clone._bound = {}
        return clone

    def __repr__(self) -> str:
        who = self.sender.address if self.sender else "read-only"
        return f"ChainClient({self.rpc_url}, {who})"

    @property
    def address(self) -> ChecksumAddress:
        """This client's account (ChainError for a read-only client)."""
        if self.sender is None:
            raise ChainError("this client has no account (read-only)")
        return self.sender.address

    # --- contracts ----------------------------------------------------------------

    def contract(self, name: str, address: str | None = None, cls: type[B] = Bound) -> B:  # type: ignore[assignment]
        """Binding for artifact ``name`` at ``address`` (default: the deployment's)."""
        if address is None:
            if self.deployment is None:
                raise ConfigError(f"no address for {name}: pass one or load a deployment")
            address = self.deployment.address_of(name)
        key = (name, address.lower())
        bound = self._bound.get(key)
        if bound is None or not isinstance(bound, cls):
            art = load_artifact(name, self.artifacts)
            c = self.w3.eth.contract(address=Web3.to_checksum_address(address), abi=art.abi,
                                     decode_tuples=True)
            bound = cls(name, c, self.sender, self.errors)
            self._bound[key] = bound
        return bound

    @property
    def token(self) -> Token:
        from node.chain.contracts import Token  # noqa: PLC0415 - avoid an import cycle
        return self.contract("PolToken", cls=Token)

    @property
    def registry(self) -> Registry:
        from node.chain.contracts import Registry  # noqa: PLC0415
        return self.contract("NodeRegistry", cls=Registry)

    @property
    def market(self) -> Market:
        from node.chain.contracts import Market  # noqa: PLC0415
        return self.contract("JobMarket", cls=Market)

    @property
    def dispute(self) -> Dispute:
        from node.chain.contracts import Dispute  # noqa: PLC0415
        return self.contract("DisputeGame", cls=Dispute)

    @property
    def collab(self) -> Collab:
        from node.chain.contracts import Collab  # noqa: PLC0415
        return self.contract("CollabMarket", cls=Collab)

    @property
    def outer_jury(self) -> OuterJury:
        from node.chain.contracts import OuterJury  # noqa: PLC0415
        return self.contract("OuterJury", cls=OuterJury)

    @property
    def availability(self) -> Availability:
        from node.chain.availability import Availability  # noqa: PLC0415
        return self.contract("Availability", cls=Availability)

    def deploy(self, name: str, *args: Any) -> Bound:
        """Deploy artifact ``name`` with constructor ``args``; returns its binding."""
        if self.sender is None:
            raise ChainError("deploy needs an account")
        art = load_artifact(name, self.artifacts)
        factory = self.w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
        data = factory.constructor(*args).data_in_transaction
        receipt = self.sender.send({"data": data})
        address = receipt["contractAddress"]
        if not address:
            raise ChainError(f"deploying {name} produced no contract address")
        return self.contract(name, address)

    # --- role conveniences (approve, then act) -----------------------------------------

    def stake(self, amount: int) -> None:
        """Approve the registry and stake ``amount`` (the node must be registered)."""
        self.token.ensure_allowance(self.registry.address, amount)
        self.registry.stake(amount)

    def post_job(self, terms: JobTerms) -> JobId:
        """Approve the market for the escrow and post the job; returns its id."""
        self.token.ensure_allowance(self.market.address, self.escrow_of(terms))
        return self.market.post_job(terms)

    def escrow_of(self, terms: JobTerms) -> int:
        """What ``postJob`` takes: the reward and the budget priced for the terms' n
        (``verification_budget`` pays the market's floor; n samples pay n / floor of it)."""
        if terms.sample_count == 0:
            return terms.reward + terms.verification_budget
        segments = terms.total_steps // terms.steps_per_segment
        floor = min(self.market.market_params().sample_count, segments)
        return terms.reward + terms.verification_budget * terms.sample_count // floor

    def post_collab_job(self, terms: CollabTerms) -> CollabId:
        """Approve the CollabMarket for the escrow and post the collaborative job."""
        self.token.ensure_allowance(self.collab.address,
                                    terms.reward + terms.verification_budget)
        return self.collab.post_collab_job(terms)

    # --- chain state ----------------------------------------------------------------

    def block_number(self) -> int:
        with rpc_guard(self.rpc_url):
            return int(self.w3.eth.block_number)

    def timestamp(self) -> int:
        """Timestamp of the latest block (the contracts' ``block.timestamp`` lower bound)."""
        with rpc_guard(self.rpc_url):
            return int(self.w3.eth.get_block("latest")["timestamp"])

    def eth_balance(self, address: str | None = None) -> int:
        with rpc_guard(self.rpc_url):
            return int(self.w3.eth.get_balance(Web3.to_checksum_address(address or self.address)))
