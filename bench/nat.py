"""Artifact throughput direct, through a relay and after a hole punch, behind real NAT
in network namespaces.

Usage (root, with `ip` and `nft`): python bench/nat.py [--mb 64] [--reps 2]

Topology (devnet/netns.py): the relay (a bootstrap node) and a public provider on
198.51.100.0/24; two providers at home A (10.0.1.0/24) and the fetcher at home B
(10.0.2.0/24), each home behind its own nftables masquerade NAT that drops
unsolicited inbound traffic. A fresh fetcher each time fetches an artifact of
--mb MiB: from the public provider (direct, out through its NAT); from the first
home provider given only its /p2p-circuit address, hole punching off on both
sides (through the relay); from the second home provider, hole punching on: a
small artifact first through the relay, then (once DCUtR made the connection
direct, within 30 s) the big one. Every node is a separate `python bench/nat.py
worker ...` process in its namespace. The last stdout line is JSON: MB/s of each
(best of --reps), the connection kind each ended on, the time from the home
provider's start to holding a relayed address, and the share of hole-punch runs
whose transfer ran on a direct connection.
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


def worker(role: str, home: str, listen: str, boot: str, mb: int, peer: str,
           punch: bool) -> None:
    import trio  # noqa: PLC0415

    from node.p2p import P2PSettings, PolnetNode  # noqa: PLC0415
    from node.p2p.nat import connection_kinds  # noqa: PLC0415

    async def main() -> None:
        t0 = time.monotonic()
        cfg = P2PSettings.model_validate({"listen": listen,
                                          "bootstrap": [boot] if boot else [],
                                          "nat": {"hole_punch": punch}})
        async with PolnetNode(home, cfg) as node:
            if role == "relay":
                _print({"addrs": node.addrs})
                await trio.sleep_forever()
            if role == "provider":
                aid = await node.publish_bytes(os.urandom(mb * 2**20) if mb else b"x")
                small = await node.publish_bytes(os.urandom(1024))
                for _ in range(600):  # at most 60 s to learn where we stand
                    st = node.nat.status()
                    if st["status"] == "public" or st["relay_addrs"]:
                        break
                    await trio.sleep(0.1)
                st = node.nat.status()
                _print({"aid": aid, "small": small, "addrs": node.addrs,
                        "status": st["status"],
                        "circuits": st["relay_addrs"],
                        "reachable_after_s": round(time.monotonic() - t0, 2)})
                await trio.sleep_forever()
            if role == "fetch":
                aid, addr = peer.split("@", 1)
                pid = addr.rsplit("/p2p/", 1)[1]
                if "," in aid:  # small first, through the relay; wait for a hole punch
                    small, aid = aid.split(",")
                    await node.fetch(small, peers=[addr], provide=False)
                    for _ in range(300):  # at most 30 s
                        if connection_kinds(node.host).get(pid) == "direct":
                            break
                        await trio.sleep(0.1)
                t = time.perf_counter()
                stats = await node.fetch(aid, peers=[addr], provide=False)
                secs = time.perf_counter() - t
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

    def spawn(lab: NatLab, ns: str, *argv: str, punch: bool = False) -> subprocess.Popen[str]:
        log = open(tmp / f"{len(procs)}.log", "w")  # noqa: SIM115 - lives with the process
        p = subprocess.Popen(lab.wrap(ns, [sys.executable, __file__, "worker", *argv,
                                           "1" if punch else "0"]),
                             stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        procs.append(p)
        return p

    with NatLab(f"pb{os.getpid() % 10000}") as lab:
        try:
            relay = _line(spawn(lab, "p11", "relay", str(tmp / "relay"),
                                f"/ip4/{lab.public_ip(11)}/tcp/0", "", "0", ""), 60)["addrs"][0]
            pub = _line(spawn(lab, "p12", "provider", str(tmp / "pub"),
                              f"/ip4/{lab.public_ip(12)}/tcp/0", relay, str(args.mb), ""), 120)
            home = _line(spawn(lab, "ha", "provider", str(tmp / "home"),
                               f"/ip4/{lab.home_ip('a')}/tcp/0", relay, str(args.mb), ""), 120)
            punch = _line(spawn(lab, "ha", "provider", str(tmp / "punch"),
                                f"/ip4/{lab.home_ip('a')}/tcp/0", relay, str(args.mb), "",
                                punch=True), 120)
            if not home["circuits"] or not punch["circuits"]:
                raise RuntimeError(f"a home provider got no relayed address: {home} {punch}")
            runs: dict[str, list[dict[str, Any]]] = {"direct": [], "relayed": [],
                                                     "hole_punched": []}
            for rep in range(args.reps):
                for kind, aid, addr in (
                        ("direct", pub["aid"], pub["addrs"][0]),
                        ("relayed", home["aid"], home["circuits"][0]),
                        ("hole_punched", f"{punch['small']},{punch['aid']}",
                         punch["circuits"][0])):
                    f = spawn(lab, "hb", "fetch", str(tmp / f"f{rep}{kind}"),
                              f"/ip4/{lab.home_ip('b')}/tcp/0", relay, "0", f"{aid}@{addr}",
                              punch=kind == "hole_punched")
                    runs[kind].append(_line(f, 600))
                    f.wait(30)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)

    def mbps(rs: list[dict[str, Any]]) -> float:
        return round(max(r["bytes"] / r["seconds"] / 1e6 for r in rs), 1)

    punched_kinds = [r["kind"] for r in runs["hole_punched"]]
    _print({"mb": args.mb, "reps": args.reps,
            "direct_MBps": mbps(runs["direct"]), "relayed_MBps": mbps(runs["relayed"]),
            "hole_punched_MBps": mbps(runs["hole_punched"]),
            "direct_kinds": [r["kind"] for r in runs["direct"]],
            "relayed_kinds": [r["kind"] for r in runs["relayed"]],
            "hole_punched_kinds": punched_kinds,
            "home_status": home["status"], "public_status": pub["status"],
            "home_reachable_via_relay_after_s": home["reachable_after_s"],
            "upgraded_to_direct_share": punched_kinds.count("direct") / len(punched_kinds)})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        r, h, lst, b, m, pr, pu = sys.argv[2:9]
        worker(r, h, lst, b, int(m), pr, pu == "1")
    else:
        main()
