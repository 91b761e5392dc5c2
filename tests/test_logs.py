"""Node logs: libp2p's chatter about peers that left stays out of INFO logs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _run(level: str) -> str:
    code = (
        "import logging\n"
        "from node.logs import configure, get_logger\n"
        f"configure(json=True, level={level!r})\n"
        "logging.getLogger('libp2p.transport.tcp').warning("
        "'Failed to open TCP stream: all attempts to connect to 127.0.0.1:9 failed')\n"
        "logging.getLogger('libp2p.kad_dht').warning('Failed to send ADD_PROVIDER to x')\n"
        "logging.getLogger('libp2p.pubsub.gossipsub').warning("
        "'Rate limit exceeded for peer x on topic polnet/states/1')\n"
        "logging.getLogger('libp2p.pubsub.utils').error("
        "'Failed to update the Certified-Addr-Book')\n"
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
    assert "Rate limit exceeded" not in info and "Certified-Addr-Book" not in info
    debug = _run("DEBUG")
    assert "Failed to open TCP stream" in debug and "ADD_PROVIDER" in debug


def _run_p2p(level: str, p2p_level: str | None) -> str:
    code = (
        "import logging\n"
        "from node.logs import configure\n"
        f"configure(json=True, level={level!r}, p2p_level={p2p_level!r})\n"
        "logging.getLogger('libp2p.host').info('libp2p says hello')\n"
        "logging.getLogger('libp2p.kad_dht.kad_dht').warning('stream closed by peer')\n"
        "logging.getLogger('urllib3').info('urllib3 says hello')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_libp2p_logs_are_quiet_by_default_and_have_their_own_level() -> None:
    quiet = _run_p2p("INFO", None)
    assert "libp2p says hello" not in quiet and "stream closed" not in quiet
    loud = _run_p2p("INFO", "INFO")  # libp2p at INFO without every library at INFO
    assert '"logger": "libp2p.host"' in loud and "libp2p says hello" in loud
    assert "urllib3 says hello" not in loud
    debug = _run_p2p("DEBUG", None)
    assert "libp2p says hello" in debug and "stream closed" in debug


def test_a_bad_log_level_is_refused() -> None:
    out = subprocess.run([sys.executable, "-m", "node.cli.main", "--log-level", "loud",
                          "job", "list"], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode != 0 and "DEBUG, INFO, WARNING, ERROR" in out.stderr
