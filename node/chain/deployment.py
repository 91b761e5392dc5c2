"""The deployment file: where the contracts live and how to reach the chain.

``polnet devnet up`` writes it to ``$POLNET_HOME/devnet/deployment.json``
(mode 0600: on a devnet it holds the funded dev accounts' keys); every
daemon reads it to find the RPC URL and contract addresses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from node.errors import ConfigError, DeploymentNotFound
from node.fsutil import atomic_write


def polnet_home() -> Path:
    return Path(os.environ.get("POLNET_HOME") or Path.home() / ".polnet")


def default_deployment_path() -> Path:
    return polnet_home() / "devnet" / "deployment.json"


class DevAccount(BaseModel):
    address: str
    private_key: str = Field(repr=False)  # devnet only; kept out of reprs and logs


class Deployment(BaseModel):
    rpc_url: str
    chain_id: int
    contracts: dict[str, str]  # contract name -> address
    deploy_block: int
    params: dict[str, Any] = Field(default_factory=dict)
    accounts: list[DevAccount] = Field(default_factory=list)

    def address_of(self, name: str) -> str:
        try:
            return self.contracts[name]
        except KeyError:
            raise ConfigError(
                f"the deployment has no contract {name!r} (has: {', '.join(self.contracts)})"
            ) from None

    def save(self, path: Path | None = None) -> Path:
        path = path or default_deployment_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, self.model_dump_json(indent=2).encode(), private=True)
        return path

    @classmethod
    def load(cls, path: Path | None = None) -> Deployment:
        path = path or default_deployment_path()
        try:
            return cls.model_validate_json(path.read_text())
        except FileNotFoundError:
            raise DeploymentNotFound(
                f"no deployment file at {path}: run `polnet devnet up` first"
            ) from None
