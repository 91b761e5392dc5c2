"""Configuration of a p2p node."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from node.p2p.limits import FetchPolicy, ServeLimits
from node.store.store import DEFAULT_MAX_SIZE

DEFAULT_HOME = Path.home() / ".polnet"


@dataclass
class NodeConfig:
    key_path: Path = DEFAULT_HOME / "p2p.key"
    store_root: Path = DEFAULT_HOME / "store"
    listen: str = "/ip4/127.0.0.1/tcp/0"
    bootstrap: list[str] = field(default_factory=list)  # full multiaddrs with /p2p/<id>
    max_artifact_size: int = DEFAULT_MAX_SIZE
    serve: ServeLimits = field(default_factory=ServeLimits)
    fetch: FetchPolicy = field(default_factory=FetchPolicy)
    ban_s: float = 600.0             # how long a misbehaving or too slow peer stays banned
    # py-libp2p's yamux is fastest with one busy stream per peer (measured: 1 stream
    # 47 MB/s, 4: 36, 8: 21), so parallelism comes from pipelined requests.
    streams_per_peer: int = 1
    announce_rate: float = 5.0       # per topic, msgs/s; gossipsub drops bursts > ~10/s
    announce_burst: int = 5
    gossip_heartbeat_s: int = 1
    # Loopback/devnet: every peer shares one IP, which gossipsub's eclipse guard rejects.
    gossip_single_ip_ok: bool = True

    @classmethod
    def in_dir(cls, home: str | Path, **kw: object) -> NodeConfig:
        h = Path(home)
        return cls(key_path=h / "p2p.key", store_root=h / "store", **kw)  # type: ignore[arg-type]
