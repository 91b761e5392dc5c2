"""The ``p2p`` section of the node's settings (node.config.NodeSettings.p2p).

A plain pydantic model, not a settings class of its own: it is reached from
TOML (``[p2p]``, ``[p2p.serve]``), the environment (``POLNET_P2P__LISTEN``,
``POLNET_P2P__SERVE__MAX_STREAMS_TOTAL``) and flags through NodeSettings, so
there is one place a value can come from. The directory a node keeps its key
and store in is not a setting: it is ``NodeSettings.p2p_dir``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from node.p2p.limits import FetchPolicy, ServeLimits
from node.store.store import DEFAULT_MAX_SIZE

#: The one listen default: loopback, any free port (a devnet; set a public address to join).
DEFAULT_LISTEN = "/ip4/127.0.0.1/tcp/0"


class NatSettings(BaseModel):
    """``[p2p.nat]`` (``POLNET_P2P__NAT__*``): reachability checks and relays."""

    model_config = ConfigDict(extra="forbid")

    reach_check: bool = Field(default=True, description="Ask peers to dial us back.")
    reach_interval_s: float = Field(default=120.0, ge=1,
                                    description="Seconds between checks once known.")
    dial_back_timeout_s: float = Field(default=5.0, gt=0)
    relay_service: Literal["auto", "on", "off"] = Field(
        default="auto", description="Serve as a circuit relay (auto: when this node has no "
                                    "bootstrap peers, i.e. it is a bootstrap node).")
    relay_client: Literal["auto", "on", "off"] = Field(
        default="auto", description="Reserve relay slots (auto: when found private).")
    relays: list[str] = Field(default_factory=list,
                              description="Relay multiaddrs tried before bootstrap peers.")
    max_relays: int = Field(default=2, ge=1, le=8)
    hole_punch: bool = Field(default=True, description="Try DCUtR hole punching over "
                                                       "relayed connections.")
    circuit_open_timeout_s: float = Field(default=10.0, gt=0)
    # served as a relay
    max_reservations: int = Field(default=64, ge=1)
    max_circuits_per_peer: int = Field(default=16, ge=1)
    reservation_ttl_s: int = Field(default=3600, ge=60)
    circuit_duration_s: int = Field(default=3600, ge=1)
    circuit_bytes: int = Field(default=4 * 1024**3, ge=1024)
    circuit_bps: float = Field(default=16 * 1024**2, gt=0,
                               description="Bandwidth of one relayed circuit, each way.")
    total_bps: float = Field(default=64 * 1024**2, gt=0,
                             description="Bandwidth of all relayed circuits together.")


class P2PSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    listen: str = Field(default=DEFAULT_LISTEN, description="libp2p listen multiaddr.")
    bootstrap: list[str] = Field(default_factory=list,
                                 description="Bootstrap multiaddrs, each ending in /p2p/<id>.")
    max_artifact_size: int = Field(default=DEFAULT_MAX_SIZE, ge=1,
                                   description="Largest artifact accepted (bytes).")
    serve: ServeLimits = Field(default_factory=ServeLimits)
    fetch: FetchPolicy = Field(default_factory=FetchPolicy)
    nat: NatSettings = Field(default_factory=NatSettings)
    ban_s: float = Field(default=600.0, ge=0,
                         description="Seconds a peer that sent something false stays banned.")
    slow_ban_s: float = Field(default=20.0, ge=0,
                              description="Seconds a peer that missed a transfer deadline "
                                          "stays banned (at most ban_s).")
    # py-libp2p's yamux is fastest with one busy stream per peer (measured: 1 stream
    # 47 MB/s, 4: 36, 8: 21), so parallelism comes from pipelined requests.
    streams_per_peer: int = Field(default=1, ge=1, le=64)
    # What we publish, per topic: msgs/s and burst. A burst plus a second's rate stays
    # under 10, the default of gossipsub's receive limit.
    announce_rate: float = Field(default=5.0, gt=0)
    announce_burst: int = Field(default=4, ge=1)
    # What we accept per forwarding peer and topic, msgs/s. gossipsub's own default (10)
    # counts what a peer *forwards*: one mesh neighbour relaying two paced publishers
    # passed it, was logged ("Rate limit exceeded") and penalised, and the messages were
    # lost. Announcements are checked one by one after this (signature, entitlement,
    # replay), so the limit only bounds a flood's cost.
    gossip_receive_rate: float = Field(default=100.0, gt=0)
    gossip_heartbeat_s: int = Field(default=1, ge=1)
    # Loopback/devnet: every peer shares one IP, which gossipsub's eclipse guard rejects.
    gossip_single_ip_ok: bool = True
