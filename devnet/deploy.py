"""Deploy the polnet contracts, wire them together and fund the dev accounts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount
from pydantic import BaseModel
from web3 import Web3

from devnet.params import DevnetParams, struct_args
from node.chain.artifacts import load_artifact
from node.chain.client import ChainClient
from node.chain.deployment import Deployment, DevAccount
from node.errors import ConfigError

# Deployment order; each may take the addresses of those before it.
CONTRACTS = ("PolToken", "NodeRegistry", "JobMarket", "Availability", "DisputeGame",
             "OuterJury", "CollabMarket")
_ADDRESS_KEYS = {"token": "PolToken", "poltoken": "PolToken", "registry": "NodeRegistry",
                 "noderegistry": "NodeRegistry", "market": "JobMarket",
                 "jobmarket": "JobMarket", "dispute": "DisputeGame",
                 "disputegame": "DisputeGame", "jury": "OuterJury",
                 "outerjury": "OuterJury", "collab": "CollabMarket",
                 "collabmarket": "CollabMarket", "availability": "Availability"}


def _address_key(arg_name: str) -> str:
    key = arg_name.strip("_").lower().removesuffix("address").removesuffix("_")
    if key not in _ADDRESS_KEYS:
        raise ConfigError(f"constructor argument {arg_name!r} names no known contract")
    return _ADDRESS_KEYS[key]


def constructor_args(name: str, addresses: Mapping[str, str], params: BaseModel | None,
                     artifacts: Path | None = None) -> list[Any]:
    """Arguments for ``name``'s constructor, by name: addresses of the contracts
    deployed before it, then parameters (struct or scalars) from ``params``."""
    abi = load_artifact(name, artifacts).abi
    ctor: dict[str, Any] = next((i for i in abi if i.get("type") == "constructor"),
                                {"inputs": []})
    args: list[Any] = []
    for inp in ctor["inputs"]:
        if inp["type"] == "address":
            args.append(addresses[_address_key(inp["name"])])
        elif params is None:
            raise ConfigError(f"{name} constructor takes {inp['name']!r} but no params given")
        else:
            args.append(struct_args(params, {**inp, "name": inp["name"].strip("_")}))
    return args


def deploy_all(w3: Web3, deployer: LocalAccount, params: DevnetParams | None = None, *,
               fund: Sequence[LocalAccount] = (), rpc_url: str | None = None,
               artifacts: Path | None = None) -> Deployment:
    """Deploy token, registry, market, availability game, dispute game, outer jury and the
    collaborative-job market (an ordinary submitter of the market); authorise market, dispute
    game and outer jury on the registry, the availability game on the market, bind the outer
    jury to the collaborative market; mint ``params.mint_per_account`` to every account in
    ``fund``. Returns the Deployment (not yet saved)."""
    params = params or DevnetParams()
    url = rpc_url or str(getattr(w3.provider, "endpoint_uri", ""))
    client = ChainClient(url, deployer, w3=w3, artifacts=artifacts)
    start_block = client.block_number()
    per_contract: dict[str, BaseModel | None] = {
        "PolToken": None, "NodeRegistry": params.registry, "JobMarket": params.market,
        "DisputeGame": params.dispute, "OuterJury": params.outer_jury,
        "CollabMarket": params.collab, "Availability": params.availability}
    addresses: dict[str, str] = {}
    for name in CONTRACTS:
        bound = client.deploy(name, *constructor_args(name, addresses, per_contract[name],
                                                      artifacts))
        addresses[name] = bound.address
    client.deployment = Deployment(rpc_url=url, chain_id=client.chain_id, contracts=addresses,
                                   deploy_block=start_block + 1)
    # Wiring and mints are independent: submit them all, then wait, so a devnet with
    # a block time spends one block on them instead of one each.
    assert client.sender is not None
    txs = [client.registry.tx_params("setAuthorized", addresses["JobMarket"],
                                     addresses["DisputeGame"], addresses["OuterJury"]),
           client.outer_jury.tx_params("bind", addresses["CollabMarket"])]
    if "setDisputeGame" in client.market.functions():
        txs.append(client.market.tx_params("setDisputeGame", addresses["DisputeGame"]))
    if "setAvailability" in client.market.functions():
        txs.append(client.market.tx_params("setAvailability", addresses["Availability"]))
    if params.mint_per_account:
        txs += [client.token.tx_params("mint", a.address, params.mint_per_account)
                for a in fund]
    hashes = [client.sender.submit(tx) for tx in txs]
    for h, tx in zip(hashes, txs, strict=True):
        client.sender.wait(h, tx)
    return Deployment(
        rpc_url=url, chain_id=client.chain_id, contracts=addresses,
        deploy_block=start_block + 1, params=params.model_dump(mode="json"),
        accounts=[DevAccount(address=a.address, private_key="0x" + bytes(a.key).hex())
                  for a in fund])
