"""Artifact throughput direct vs through a relay, behind real NAT in network namespaces.

Usage (root, with `ip` and `nft`): python bench/nat.py [--mb 64] [--reps 2]

Topology (devnet/netns.py): the relay (a bootstrap node) and a public provider on
198.51.100.0/24; a provider at home A (10.0.1.0/24) and the fetcher at home B
(10.0.2.0/24), each home behind its own nftables masquerade NAT that drops
unsolicited inbound traffic. The fetcher (a fresh node each repetition) fetches
the same artifact from the public provider (a direct connection, out through its
NAT) and from the home-A provider given only its /p2p-circuit address (through
the relay). Every node is a separate `python bench/nat.py worker ...` process in
its namespace. The last stdout line is JSON: MB/s direct and relayed, the time
from the home provider's start to holding a relayed address, and the share of
transfers to a home node that ended on a direct connection (no hole punching is
done yet: 0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _print(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def worker(role: str, home: str, listen: str, boot: str, mb: int, peer: str) -> None:
    import trio  # noqa: PLC0415

    from node.p2p import P2PSettings, PolnetNode  # noqa: PLC0415
    from node.p2p.nat import connection_kinds  # noqa: PLC0415

    async def main() -> None:
        t0 = time.monotonic()
        cfg = P2PSettings.model_validate({"listen": listen,
                                          "bootstrap": [boot] if boot else []})
        async with PolnetNode(home, cfg) as node:
            if role == "relay":
                _print({"addrs": node.addrs})
                await trio.sleep_forever()
            if role == "provider":
                aid = await node.publish_bytes(os.urandom(mb * 2**20) if mb else b"x")
                for _ in range(600):  # at most 60 s to learn where we stand
                    st = node.nat.status()
                    if st["status"] == "public" or st["relay_addrs"]:
                        break
                    await trio.sleep(0.1)
                st = node.nat.status()
                _print({"aid": aid, "addrs": node.addrs, "status": st["status"],
                        "circuits": st["relay_addrs"],
                        "reachable_after_s": round(time.monotonic() - t0, 2)})
                await trio.sleep_forever()
            if role == "fetch":
                aid, addr = peer.split("@", 1)
                t = time.perf_counter()
                stats = await node.fetch(aid, peers=[addr], provide=False)
                secs = time.perf_counter() - t
                pid = addr.rsplit("/p2p/", 1)[1]
                _print({"seconds": secs, "bytes": node.store.size(aid),
                        "kind": connection_kinds(node.host).get(pid, "?"),
                        "chunks": sum(stats.chunks_fetched.values())})

    trio.run(main)


def _line(p: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    end = time.monotonic() + timeout
    assert p.stdout is not None
    while time.monotonic() < end:
        line = p.stdout.readline()
        if line.startswith("{"):
            out: dict[str, Any] = json.loads(line)
            return out
        if not line and p.poll() is not None:
            break
    raise RuntimeError(f"worker gave no JSON line in {timeout:.0f}s (exit {p.poll()})")


def main() -> None:
    from devnet.netns import NatLab  # noqa: PLC0415

    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    why = NatLab.unavailable()
    if why:
        raise SystemExit(f"bench/nat.py needs network namespaces and nftables: {why}")
    tmp = Path(tempfile.mkdtemp(prefix="natbench"))
    procs: list[subprocess.Popen[str]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

    def spawn(lab: NatLab, ns: str, *argv: str) -> subprocess.Popen[str]:
        log = open(tmp / f"{len(procs)}.log", "w")  # noqa: SIM115 - lives with the process
        p = subprocess.Popen(lab.wrap(ns, [sys.executable, __file__, "worker", *argv]),
                             stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        procs.append(p)
        return p

    with NatLab(f"pb{os.getpid() % 10000}") as lab:
        try:
            relay = _line(spawn(lab, "p11", "relay", str(tmp / "relay"),
                                "/ip4/198.51.100.11/tcp/0", "", "0", ""), 60)["addrs"][0]
            pub = _line(spawn(lab, "p12", "provider", str(tmp / "pub"),
                              "/ip4/198.51.100.12/tcp/0", relay, str(args.mb), ""), 120)
            home = _line(spawn(lab, "ha", "provider", str(tmp / "home"),
                               f"/ip4/{lab.home_ip('a')}/tcp/0", relay, str(args.mb), ""), 120)
            if not home["circuits"]:
                raise RuntimeError(f"the home provider got no relayed address: {home}")
            runs: dict[str, list[dict[str, Any]]] = {"direct": [], "relayed": []}
            for rep in range(args.reps):
                for kind, aid, addr in (("direct", pub["aid"], pub["addrs"][0]),
                                        ("relayed", home["aid"], home["circuits"][0])):
                    f = spawn(lab, "hb", "fetch", str(tmp / f"f{rep}{kind}"),
                              f"/ip4/{lab.home_ip('b')}/tcp/0", relay, "0", f"{aid}@{addr}")
                    runs[kind].append(_line(f, 600))
                    f.wait(30)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)

    def mbps(rs: list[dict[str, Any]]) -> float:
        return round(max(r["bytes"] / r["seconds"] / 1e6 for r in rs), 1)

    relayed_kinds = [r["kind"] for r in runs["relayed"]]
    _print({"mb": args.mb, "reps": args.reps,
            "direct_MBps": mbps(runs["direct"]), "relayed_MBps": mbps(runs["relayed"]),
            "direct_kinds": [r["kind"] for r in runs["direct"]],
            "relayed_kinds": relayed_kinds,
            "home_status": home["status"], "public_status": pub["status"],
            "home_reachable_via_relay_after_s": home["reachable_after_s"],
            "upgraded_to_direct_share": relayed_kinds.count("direct") / len(relayed_kinds),
            "hole_punching": "not implemented"})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        r, h, lst, b, m, pr = sys.argv[2:8]
        worker(r, h, lst, b, int(m), pr)
    else:
        main()
