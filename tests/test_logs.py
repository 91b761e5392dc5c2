"""Node logs: libp2p's chatter about peers that left stays out of INFO logs."""

from __future__ import annotations

import subprocess
import sys


def _run(level: str) -> str:
    code = (
        "import logging\n"
        "from node.logs import configure, get_logger\n"
        f"configure(json=True, level={level!r})\n"
        "logging.getLogger('libp2p.transport.tcp').warning("
        "'Failed to open TCP stream: all attempts to connect to 127.0.0.1:9 failed')\n"
        "logging.getLogger('libp2p.kad_dht').warning('Failed to send ADD_PROVIDER to x')\n"
        "logging.getLogger('libp2p.pubsub').warning('a real libp2p problem')\n"
        "get_logger('polnet.test').info('node_event', n=1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_departed_peer_noise_is_debug_only() -> None:
    info = _run("INFO")
    assert "a real libp2p problem" in info and "node_event" in info
    assert "Failed to open TCP stream" not in info and "ADD_PROVIDER" not in info
    debug = _run("DEBUG")
    assert "Failed to open TCP stream" in debug and "ADD_PROVIDER" in debug
