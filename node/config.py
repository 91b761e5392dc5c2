"""Node configuration: a TOML file (``--config``), then ``POLNET_*`` environment
variables, then command-line flags, each overriding the one before.

One model for every command: ``home`` (``POLNET_HOME``) is the root, ``name``
picks the node directory ``HOME/nodes/NAME`` under it (its p2p key and artifact
store in ``p2p/``), and the libp2p settings are the nested section ``p2p``:
``[p2p]`` / ``[p2p.serve]`` in TOML, ``POLNET_P2P__LISTEN`` or
``POLNET_P2P__SERVE__MAX_STREAMS_TOTAL`` in the environment (``__`` nests).

Config crosses a trust boundary (files and environments written by people), so
it is a strict pydantic model: unknown keys are errors that name the key.
Private keys are ``SecretStr`` and never printed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from node.chain.rpc import RpcSettings
from node.errors import ConfigError
from node.p2p.config import P2PSettings


def default_home() -> Path:
    return Path(os.environ.get("POLNET_HOME", Path.home() / ".polnet")).expanduser()


class NetworkProfile(BaseModel):
    """A named EVM chain: ``[networks.NAME]`` in TOML, picked with ``--network NAME``."""

    model_config = ConfigDict(extra="forbid")

    rpc_url: str = Field(pattern=r"^https?://", description=(
        "JSON-RPC URL over HTTP(S); a WebSocket endpoint goes in [rpc] ws_url."))
    chain_id: int = Field(ge=1, description="Refuse a node that answers with another one.")
    deployment: Path = Field(description="Where `polnet deploy` writes the addresses and "
                                         "every command reads them.")
    confirmations: int = Field(0, ge=0, le=128,
                               description="Blocks to stay behind the head when reading "
                                           "events (0 on a devnet; more where chains reorg).")

    @field_validator("deployment", mode="after")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()


class NodeSettings(BaseSettings):
    """Everything a solver, verifier or submitter process needs to start."""

    model_config = SettingsConfigDict(env_prefix="POLNET_", env_nested_delimiter="__",
                                      extra="forbid", validate_default=True)
    _toml_path: ClassVar[Path | None] = None

    home: Path = Field(default_factory=default_home,
                       description="Root of node state, keys and the devnet deployment file.")
    name: str = Field("node", pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                      description="This node's state lives in HOME/nodes/NAME.")
    deployment: Path | None = Field(None, description="Deployment JSON; default: the devnet's.")
    rpc_url: str | None = Field(None, pattern=r"^https?://", description=(
        "JSON-RPC URL over HTTP(S); default: the deployment's. A WebSocket endpoint "
        "goes in [rpc] ws_url."))
    dev_account: int | None = Field(None, ge=0,
                                    description="Use the devnet's dev key with this index.")
    keystore: Path | None = Field(None, description="Encrypted eth-account keystore JSON.")
    keystore_password: SecretStr | None = Field(None, description="Password of the keystore.")
    private_key: SecretStr | None = Field(None, description="Raw key (prefer a keystore).")
    metrics_port: int | None = Field(None, ge=0, le=65535,
                                     description="Serve Prometheus /metrics here (0: any).")
    threads: int = Field(1, ge=1, le=256, description="Torch threads for training/replay.")
    keep_every: int = Field(10, ge=1, le=32, description=(
        "Solver: keep a full checkpoint every this many segments (and the last); the "
        "others are regenerated when sampled or disputed. 1 keeps all of them."))
    watch_sample: bool = Field(True, description=(
        "Verifier: replay the job's whole sample, not only this node's committee share "
        "(a watchdog: a won challenge pays). Off: replay only its own share, when drawn "
        "to the committee."))
    stake: int = Field(1000 * 10**18, ge=0, description="Stake to keep bonded (token wei).")
    poll_interval: float = Field(0.5, gt=0, le=60, description="Chain polling period (s).")
    p2p: P2PSettings = Field(default_factory=P2PSettings, description="libp2p: [p2p] section.")
    rpc: RpcSettings = Field(default_factory=RpcSettings,
                             description="JSON-RPC: [rpc] section (request budget, retries).")
    networks: dict[str, NetworkProfile] = Field(
        default_factory=dict, description="Named chains: [networks.NAME] sections.")
    network: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                                description="Use [networks.NAME]: its RPC URL, chain id, "
                                            "deployment file and confirmations.")
    confirmations: int = Field(0, ge=0, le=128, description="Blocks behind the head for events.")

    @model_validator(mode="after")
    def _apply_network(self) -> NodeSettings:
        # A profile fills what was not given explicitly; an explicit flag still wins.
        if self.network is None:
            return self
        prof = self.networks.get(self.network)
        if prof is None:
            known = ", ".join(sorted(self.networks)) or "none"
            raise ValueError(f"unknown network {self.network!r} (configured: {known}): add a "
                             f"[networks.{self.network}] section with rpc_url, chain_id and "
                             "deployment to your --config file")
        if self.rpc_url is None:
            self.rpc_url = prof.rpc_url
        if self.deployment is None:
            self.deployment = prof.deployment
        if "confirmations" not in self.model_fields_set:
            self.confirmations = prof.confirmations
        return self

    @property
    def expected_chain_id(self) -> int | None:
        """The chain id the selected network profile promises (None: no profile)."""
        return self.networks[self.network].chain_id if self.network else None

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
    def p2p_dir(self) -> Path:
        """The node's libp2p key and artifact store: what every command of NAME uses."""
        return self.node_dir / "p2p"

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


P2P_FLAGS = ("listen", "bootstrap")


def load_config(path: Path | None = None, **flags: Any) -> NodeSettings:
    """Build a config from ``path`` (TOML), the environment and ``flags``.

    Flags whose value is ``None`` are treated as not given; ``listen`` and
    ``bootstrap`` (the CLI's ``--listen``/``--bootstrap``) go to the p2p section.
    """
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    given = {k: v for k, v in flags.items() if v is not None}
    p2p = {k: given.pop(k) for k in P2P_FLAGS if k in given}
    if p2p:  # merged with the environment's and the file's p2p values, key by key
        given["p2p"] = p2p
    NodeSettings._toml_path = path
    try:
        return NodeSettings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        hint = (f"; it is p2p.{where} now ([p2p] in TOML, POLNET_P2P__{where.upper()})"
                if where in P2P_FLAGS else "")
        raise ConfigError(f"{where}: {first['msg']}{hint} "
                          f"(from {path or 'environment/flags'})") from None
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
