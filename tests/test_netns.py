"""The namespace lab itself (devnet/netns.py): two labs alive at once, as under
pytest-xdist, must not share a public range. Both attach the root namespace to their
public segment, so on one range the root namespace had two routes to it and its
replies to one lab's hosts went to the other lab (anvil's RPC, served from the root
namespace, then failed for one of the labs while the other lived)."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterator

import pytest

from devnet.netns import PUBLIC_NETS, NatLab

WHY_NOT = NatLab.unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces: {WHY_NOT}")

_CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
    s.sendall(sys.argv[3].encode()); print(s.recv(100).decode())
"""


def _echo_server() -> tuple[socket.socket, int]:
    """A TCP server on 127.0.0.1 answering each connection with 'echo:' + what it read."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                c.sendall(b"echo:" + c.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    return srv, int(srv.getsockname()[1])


@pytest.fixture
def two_labs() -> Iterator[tuple[NatLab, NatLab]]:
    base = os.getpid() % 1000
    with NatLab(f"pt{base}a") as a, NatLab(f"pt{base}b") as b:
        yield a, b
    assert a.public_net and a._slot is None and b._slot is None  # ranges given back


def test_labs_alive_at_once_each_reach_their_own_root(two_labs: tuple[NatLab, NatLab]
                                                      ) -> None:
    a, b = two_labs
    assert a.public_net != b.public_net
    assert {a.public_net, b.public_net} <= set(PUBLIC_NETS)
    srv, port = _echo_server()
    try:
        for lab in (a, b):
            lab.forward_tcp(port, port)
        # each lab's public host and home host reach the root namespace's forwarder
        for lab in (a, b):
            for ns in ("p12", "ha"):
                tag = f"{lab.prefix}-{ns}"
                p = lab.run(ns, [sys.executable, "-c", _CLIENT, lab.root_ip, str(port), tag],
                            check=False, timeout=30)
                assert p.returncode == 0, f"{tag}: {p.stderr.strip()}"
                assert p.stdout.strip() == f"echo:{tag}"
    finally:
        srv.close()

