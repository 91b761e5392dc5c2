"""A small internet in Linux network namespaces, with home routers doing real NAT.

    with NatLab("pn1234") as lab:          # root only; see NatLab.unavailable()
        lab.run("pub", ["ip", "-br", "addr"])

Topology (every address belongs to a namespace created here; no namespace has a
default route, so nothing leaves them):

- ``pub``: the public segment ``<public_net>.0/24`` (a documentation range,
  198.51.100.0/24 for the first lab) on a bridge; each public host (``public_hosts``,
  .10 to .13 by default) is a namespace of its own on it (``p10``...:
  ``public_ns(ip)``), so its connections come from its address. The test's own root
  namespace is attached at ``root_ip`` (.254; only that connected route: nothing
  forwards beyond), so the test can serve anvil's JSON-RPC on the public side. Labs
  alive at once (pytest-xdist workers) each hold one of ``PUBLIC_NETS`` (a lock file
  per range): two labs on one range would give the root namespace two routes to it,
  and its replies to one lab's hosts would reach the other's.
- one router namespace per home (``r<home>``): ``wan`` on the public segment,
  ``lan`` on the home's private range, nftables masquerade out of ``wan`` and a
  forward/input policy that drops every unsolicited inbound packet.
- one host namespace per home (``h<home>``): the home's computers, default route
  via its router.

``symmetric=True`` gives a home a symmetric NAT (random source ports per
destination: ``masquerade random``), which hole punching cannot cross.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from node.errors import PolnetError

# Documentation and benchmarking ranges: "public" to polnet (not RFC 1918 or CGNAT), and
# routed nowhere. One per lab alive at once; one the machine itself uses (a container's
# own network may be a documentation range) is skipped.
PUBLIC_NETS = ("198.51.100", "203.0.113", "198.18.0", "198.19.0", "192.0.2")
SLOT_WAIT_S = 900.0  # a lab waits for a range at most this long (labs live minutes)


class NetnsError(PolnetError, RuntimeError):
    """A namespace, link or nftables command failed."""


@dataclass
class Home:
    name: str          # "a", "b"
    subnet: int        # 10.0.<subnet>.0/24
    wan_host: int      # the router's public address: <public_net>.<wan_host>
    symmetric: bool = False

    @property
    def gateway(self) -> str:
        return f"10.0.{self.subnet}.1"

    @property
    def host_ip(self) -> str:
        return f"10.0.{self.subnet}.2"


def _in_use_here(net: str) -> bool:
    """Does an interface of this (root) namespace have an address in ``net``.0/24?"""
    out = _sh(["ip", "-4", "-o", "addr", "show"]).stdout
    return f"inet {net}." in out


def _sh(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise NetnsError(f"{' '.join(args)}: {p.stderr.strip() or p.stdout.strip()}")
    return p


@dataclass
class NatLab:
    prefix: str                                   # unique per run, <= 6 chars
    host_numbers: list[int] = field(default_factory=lambda: list(range(10, 14)))
    homes: list[Home] = field(default_factory=lambda: [Home("a", 1, 2), Home("b", 2, 3)])
    public_net: str = ""  # taken from PUBLIC_NETS on entry
    _made: list[str] = field(default_factory=list)
    _root_link: str | None = None
    _forwarders: list[socket.socket] = field(default_factory=list)
    _slot: IO[bytes] | None = None

    def public_ip(self, host: int) -> str:
        return f"{self.public_net}.{host}"

    @property
    def public_hosts(self) -> list[str]:
        return [self.public_ip(n) for n in self.host_numbers]

    @property
    def root_ip(self) -> str:
        """The test's root namespace on the public segment (anvil's RPC is served there)."""
        return self.public_ip(254)

    @staticmethod
    def unavailable() -> str | None:
        """Why namespaces with nftables NAT cannot be used here (None: they can)."""
        if os.geteuid() != 0:
            return "network namespaces need root (ip netns add)"
        for tool in ("ip", "nft"):
            if shutil.which(tool) is None:
                return f"`{tool}` is missing (Debian: apt-get install iproute2 nftables)"
        probe = f"pnprobe{os.getpid() % 100000}"
        p = _sh(["ip", "netns", "add", probe], check=False)
        if p.returncode != 0:
            return f"cannot create a network namespace: {p.stderr.strip()}"
        try:
            p = _sh(["ip", "netns", "exec", probe, "nft", "add", "table", "ip", "t"],
                    check=False)
            if p.returncode != 0:
                return f"nftables does not work in a namespace: {p.stderr.strip()}"
        finally:
            _sh(["ip", "netns", "del", probe], check=False)
        return None

    def ns(self, short: str) -> str:
        return f"{self.prefix}-{short}"

    def _netns(self, short: str) -> str:
        name = self.ns(short)
        _sh(["ip", "netns", "add", name])
        self._made.append(name)
        _sh(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def _veth(self, a_ns: str | None, a_name: str, b_ns: str, b_name: str) -> None:
        """A veth pair: end a_name in a_ns (None: the root namespace), b_name in b_ns."""
        tmp_a, tmp_b = f"{self.prefix}x{len(self._made)}a", f"{self.prefix}x{len(self._made)}b"
        _sh(["ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b])
        if a_ns is not None:
            _sh(["ip", "link", "set", tmp_a, "netns", a_ns])
            _sh(["ip", "-n", a_ns, "link", "set", tmp_a, "name", a_name])
        else:
            _sh(["ip", "link", "set", tmp_a, "name", a_name])
            self._root_link = a_name
        _sh(["ip", "link", "set", tmp_b, "netns", b_ns])
        _sh(["ip", "-n", b_ns, "link", "set", tmp_b, "name", b_name])
        self._made.append(f"link:{tmp_a}")

    def _take_public_net(self) -> None:
        """Hold one of PUBLIC_NETS while the lab lives (an flock, gone with the process
        if it dies): no other lab on this machine uses that range meanwhile."""
        end = time.monotonic() + SLOT_WAIT_S
        while True:
            for net in PUBLIC_NETS:
                if _in_use_here(net):
                    continue  # the machine's own network, or a lab that takes no lock
                f = open(f"/tmp/polnet-natlab-{net}.lock", "wb")  # noqa: SIM115 - held
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    f.close()
                    continue
                self._slot, self.public_net = f, net
                return
            if time.monotonic() > end:
                raise NetnsError(f"{len(PUBLIC_NETS)} network labs are running on this "
                                 f"machine and none ended in {SLOT_WAIT_S:.0f}s: run fewer "
                                 "NAT tests at once")
            time.sleep(1)

    def __enter__(self) -> NatLab:
        try:
            self._take_public_net()
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        pub = self._netns("pub")
        _sh(["ip", "-n", pub, "link", "add", "br0", "type", "bridge"])
        _sh(["ip", "-n", pub, "link", "set", "br0", "up"])
        for ip in self.public_hosts:  # one namespace each: its own source address
            host = self._netns(self.public_ns(ip))
            port = f"to{ip.rsplit('.', 1)[1]}"
            self._veth(host, "eth0", pub, port)
            _sh(["ip", "-n", pub, "link", "set", port, "master", "br0", "up"])
            _sh(["ip", "-n", host, "addr", "add", f"{ip}/24", "dev", "eth0"])
            _sh(["ip", "-n", host, "link", "set", "eth0", "up"])
        # the test's root namespace on the public segment (anvil's RPC is served there)
        root_dev = f"{self.prefix}root"[:15]
        self._veth(None, root_dev, pub, "toroot")
        _sh(["ip", "-n", pub, "link", "set", "toroot", "master", "br0", "up"])
        _sh(["ip", "addr", "add", f"{self.root_ip}/24", "dev", root_dev])
        _sh(["ip", "link", "set", root_dev, "up"])
        for home in self.homes:
            r = self._netns(f"r{home.name}")
            h = self._netns(f"h{home.name}")
            self._veth(r, "wan", pub, f"to{home.name}")
            _sh(["ip", "-n", pub, "link", "set", f"to{home.name}", "master", "br0", "up"])
            self._veth(r, "lan", h, "eth0")
            _sh(["ip", "-n", r, "addr", "add", f"{self.public_ip(home.wan_host)}/24", "dev",
                 "wan"])
            _sh(["ip", "-n", r, "addr", "add", f"{home.gateway}/24", "dev", "lan"])
            _sh(["ip", "-n", h, "addr", "add", f"{home.host_ip}/24", "dev", "eth0"])
            for ns, dev in ((r, "wan"), (r, "lan"), (h, "eth0")):
                _sh(["ip", "-n", ns, "link", "set", dev, "up"])
            _sh(["ip", "-n", h, "route", "add", "default", "via", home.gateway])
            _sh(["ip", "netns", "exec", r, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
            masq = "masquerade random" if home.symmetric else "masquerade"
            rules = f"""
table ip nat {{
  chain post {{ type nat hook postrouting priority srcnat; policy accept;
    oifname "wan" {masq}; }}
}}
table inet fw {{
  chain forwarding {{ type filter hook forward priority filter; policy drop;
    ct state established,related accept; iifname "lan" oifname "wan" accept; }}
  chain incoming {{ type filter hook input priority filter; policy drop;
    ct state established,related accept; iifname "lo" accept; iifname "lan" accept; }}
}}
"""
            p = subprocess.run(["ip", "netns", "exec", r, "nft", "-f", "-"], input=rules,
                               capture_output=True, text=True, timeout=30)
            if p.returncode != 0:
                raise NetnsError(f"nft in {r}: {p.stderr.strip()}")

    @staticmethod
    def public_ns(ip: str) -> str:
        """The namespace of public host `ip` (e.g. "p11" for <public_net>.11)."""
        return f"p{ip.rsplit('.', 1)[1]}"

    def home_ip(self, home: str) -> str:
        return next(h.host_ip for h in self.homes if h.name == home)

    def wan_ip(self, home: str) -> str:
        return self.public_ip(next(h.wan_host for h in self.homes if h.name == home))

    def wrap(self, short: str, argv: Sequence[str]) -> list[str]:
        """argv run inside namespace `short` ("pub", "ha", "ra", ...)."""
        return ["ip", "netns", "exec", self.ns(short), *argv]

    def run(self, short: str, argv: Sequence[str], check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(self.wrap(short, argv), capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise NetnsError(f"{argv} in {short}: {p.stderr.strip()}")
        return p

    def forward_tcp(self, port: int, to_port: int) -> None:
        """Serve root_ip:port (public side) by forwarding to 127.0.0.1:to_port."""
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((self.root_ip, port))
        srv.listen(64)
        self._forwarders.append(srv)

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        def accept() -> None:
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return  # closed
                try:
                    u = socket.create_connection(("127.0.0.1", to_port), timeout=10)
                    u.settimeout(None)
                except OSError:
                    c.close()
                    continue
                for x, y in ((c, u), (u, c)):
                    threading.Thread(target=pipe, args=(x, y), daemon=True).start()

        threading.Thread(target=accept, daemon=True, name="netns-forward").start()

    def close(self) -> None:
        for srv in self._forwarders:
            with contextlib.suppress(OSError):
                srv.close()
        self._forwarders.clear()
        if self._root_link is not None:
            _sh(["ip", "link", "del", self._root_link], check=False)
            self._root_link = None
        for name in reversed(self._made):
            if name.startswith("link:"):
                continue  # veths go with their namespaces
            # processes still inside keep a namespace alive: kill them first
            pids = _sh(["ip", "netns", "pids", name], check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), 9)
            _sh(["ip", "netns", "del", name], check=False)
        self._made.clear()
        if self._slot is not None:  # the range is free for another lab
            self._slot.close()
            self._slot = None
