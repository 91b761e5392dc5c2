"""polnet's peer-to-peer layer: libp2p host, discovery, announcements, artifact transfer.

Names are imported on first use: the settings (node.p2p.config) are read by every
command, and importing libp2p costs about a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.p2p.announce import Announcement, ArtifactAvailable, JobPosted, ResultCommitted
    from node.p2p.config import P2PSettings
    from node.p2p.host import PolnetNode
    from node.p2p.limits import FetchPolicy, ServeLimits
    from node.p2p.wire import PROTOCOL_ID

_WHERE = {"Announcement": "announce", "ArtifactAvailable": "announce", "JobPosted": "announce",
          "ResultCommitted": "announce", "P2PSettings": "config", "PolnetNode": "host",
          "FetchPolicy": "limits", "ServeLimits": "limits", "PROTOCOL_ID": "wire"}

__all__ = ["PROTOCOL_ID", "Announcement", "ArtifactAvailable", "FetchPolicy", "JobPosted",
           "P2PSettings", "PolnetNode", "ResultCommitted", "ServeLimits"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'node.p2p' has no attribute {name!r}")
    return getattr(importlib.import_module(f"node.p2p.{_WHERE[name]}"), name)
