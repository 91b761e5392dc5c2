"""polnet's peer-to-peer layer: libp2p host, discovery, announcements, artifact transfer."""

from node.p2p.announce import Announcement, ArtifactAvailable, JobPosted, ResultCommitted
from node.p2p.config import NodeConfig
from node.p2p.host import PolnetNode
from node.p2p.limits import ServeLimits
from node.p2p.wire import PROTOCOL_ID

__all__ = ["PROTOCOL_ID", "Announcement", "ArtifactAvailable", "JobPosted", "NodeConfig",
           "PolnetNode", "ResultCommitted", "ServeLimits"]
