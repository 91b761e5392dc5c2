"""Node configuration: a TOML file (``--config``), then ``POLNET_*`` environment
variables, then command-line flags, each overriding the one before.

Config crosses a trust boundary (files and environments written by people), so
it is a strict pydantic model: unknown keys are errors that name the key.
Private keys are ``SecretStr`` and never printed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from node.errors import ConfigError


def default_home() -> Path:
    return Path(os.environ.get("POLNET_HOME", Path.home() / ".polnet")).expanduser()


class NodeSettings(BaseSettings):
    """Everything a solver, verifier or submitter process needs to start."""

    model_config = SettingsConfigDict(env_prefix="POLNET_", extra="forbid",
                                      validate_default=True)
    _toml_path: ClassVar[Path | None] = None

    home: Path = Field(default_factory=default_home,
                       description="Root of node state, keys and the devnet deployment file.")
    name: str = Field("node", pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                      description="This node's state lives in HOME/nodes/NAME.")
    deployment: Path | None = Field(None, description="Deployment JSON; default: the devnet's.")
    rpc_url: str | None = Field(None, description="JSON-RPC URL; default: the deployment's.")
    dev_account: int | None = Field(None, ge=0,
                                    description="Use the devnet's dev key with this index.")
    keystore: Path | None = Field(None, description="Encrypted eth-account keystore JSON.")
    keystore_password: SecretStr | None = Field(None, description="Password of the keystore.")
    private_key: SecretStr | None = Field(None, description="Raw key (prefer a keystore).")
    listen: str = Field("/ip4/127.0.0.1/tcp/0", description="libp2p listen multiaddr.")
    bootstrap: list[str] = Field(default_factory=list, description="Bootstrap multiaddrs.")
    metrics_port: int | None = Field(None, ge=0, le=65535,
                                     description="Serve Prometheus /metrics here (0: any).")
    threads: int = Field(1, ge=1, le=256, description="Torch threads for training/replay.")
    keep_every: int = Field(10, ge=1, le=32, description=(
        "Solver: keep a full checkpoint every this many segments (and the last); the "
        "others are regenerated when sampled or disputed. 1 keeps all of them."))
    stake: int = Field(1000 * 10**18, ge=0, description="Stake to keep bonded (token wei).")
    poll_interval: float = Field(0.5, gt=0, le=60, description="Chain polling period (s).")

    @field_validator("home", "deployment", "keystore", mode="after")
    @classmethod
    def _expand(cls, v: Path | None) -> Path | None:
        return v.expanduser() if v is not None else None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls._toml_path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=cls._toml_path))
        return tuple(sources)

    @property
    def node_dir(self) -> Path:
        return self.home / "nodes" / self.name

    @property
    def deployment_path(self) -> Path:
        return self.deployment or self.home / "devnet" / "deployment.json"

    def load_private_key(self) -> str:
        """The account key as 0x-hex, from (in order) a raw key, a keystore or a dev account."""
        if self.private_key is not None:
            return self.private_key.get_secret_value()
        if self.keystore is not None:
            return _decrypt_keystore(self.keystore, self.keystore_password)
        if self.dev_account is not None:
            return _dev_key(self.deployment_path, self.dev_account)
        raise ConfigError("no account configured: pass --dev-account N (devnet), "
                          "--keystore FILE, or set POLNET_PRIVATE_KEY")


def load_config(path: Path | None = None, **flags: Any) -> NodeSettings:
    """Build a config from ``path`` (TOML), the environment and ``flags``.

    Flags whose value is ``None`` are treated as not given.
    """
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    given = {k: v for k, v in flags.items() if v is not None}
    NodeSettings._toml_path = path
    try:
        return NodeSettings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise ConfigError(f"{where}: {first['msg']} (from {path or 'environment/flags'})") from None
    finally:
        NodeSettings._toml_path = None


def _decrypt_keystore(path: Path, password: SecretStr | None) -> str:
    from eth_account import Account  # noqa: PLC0415

    if password is None:
        raise ConfigError("keystore needs a password: set POLNET_KEYSTORE_PASSWORD")
    try:
        blob = json.loads(path.read_text())
        key: bytes = Account.decrypt(blob, password.get_secret_value())
    except FileNotFoundError:
        raise ConfigError(f"keystore {path} does not exist") from None
    except (ValueError, KeyError) as exc:
        # eth-account says "MAC mismatch" for a wrong password; never echo the password.
        raise ConfigError(f"cannot decrypt keystore {path}: {exc}") from None
    return "0x" + key.hex()


def _dev_key(deployment: Path, index: int) -> str:
    from node.chain.deployment import Deployment  # noqa: PLC0415 - web3 is heavy

    accounts = Deployment.load(deployment).accounts
    if index >= len(accounts):
        raise ConfigError(f"dev account {index} does not exist; the devnet has {len(accounts)}")
    return accounts[index].private_key
