"""Artifact transfer throughput: our protocol vs a plain TCP copy, two processes, loopback.

Usage: python bench/p2p_throughput.py [--mb 256]
The last stdout line is JSON: p2p and tcp MB/s, their ratio, and the receiving
process's peak RSS and its growth over the transfer.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BLOCK = 1024 * 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KiB on Linux


def receive_p2p(addr: str, aid: str, home: str) -> dict[str, float]:
    import trio  # noqa: PLC0415

    from node.p2p import NodeConfig, PolnetNode  # noqa: PLC0415

    out: dict[str, float] = {}

    async def main() -> None:
        cfg = NodeConfig.in_dir(home, streams_per_peer=int(os.environ.get("BENCH_STREAMS", "1")))
        async with PolnetNode(cfg) as node:
            await node.connect(addr)
            out["rss_before_mb"] = rss_mb()
            t = time.perf_counter()
            await node.fetch(aid, peers=[addr], provide=False)
            out["seconds"] = time.perf_counter() - t
            out["rss_after_mb"] = rss_mb()

    trio.run(main)
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def receive_tcp(port: int, dest: str) -> dict[str, float]:
    with socket.create_connection(("127.0.0.1", port)) as s, open(dest, "wb") as fh:
        t = time.perf_counter()
        while data := s.recv(BLOCK):
            fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
        return {"seconds": time.perf_counter() - t}


def serve_tcp(path: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        print(srv.getsockname()[1], flush=True)
        conn, _ = srv.accept()
        with conn, open(path, "rb") as fh:
            while block := fh.read(BLOCK):
                conn.sendall(block)


def child(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--role", default="bench")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.role == "recv-p2p":
        print(json.dumps(receive_p2p(*a.rest)))
        return
    if a.role == "recv-tcp":
        print(json.dumps(receive_tcp(int(a.rest[0]), a.rest[1])))
        return
    if a.role == "serve-tcp":
        serve_tcp(a.rest[0])
        return

    from node.store import ArtifactStore  # noqa: PLC0415

    size = a.mb * 1_000_000
    with tempfile.TemporaryDirectory(prefix="polnet-bench-") as tmp:
        src = Path(tmp) / "src.bin"
        with open(src, "wb") as fh:
            for _ in range(size // BLOCK):
                fh.write(os.urandom(BLOCK))
            fh.write(os.urandom(size % BLOCK))
        store = ArtifactStore(Path(tmp) / "prov" / "store")
        aid = store.put_file(src)

        prov = subprocess.Popen(
            [sys.executable, "-m", "node.p2p.serve", "--home", str(Path(tmp) / "prov")],
            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert prov.stdout is not None
            addr = json.loads(prov.stdout.readline())["addrs"][0]
            r = child(["--role", "recv-p2p", addr, aid, str(Path(tmp) / "recv")])
            p2p = json.loads(r.communicate(timeout=600)[0].strip().splitlines()[-1])
        finally:
            prov.kill()
            prov.wait()
        got = ArtifactStore(Path(tmp) / "recv" / "store")
        assert got.has(aid), "p2p transfer did not complete"
        got.path(aid).unlink()

        srv = child(["--role", "serve-tcp", str(src)])
        assert srv.stdout is not None
        port = srv.stdout.readline().strip()
        r = child(["--role", "recv-tcp", port, str(Path(tmp) / "tcp.bin")])
        tcp = json.loads(r.communicate(timeout=600)[0].strip().splitlines()[-1])
        srv.wait(60)

    p2p_mbs = size / 1e6 / p2p["seconds"]
    tcp_mbs = size / 1e6 / tcp["seconds"]
    print(json.dumps({
        "bytes": size,
        "p2p_MBps": round(p2p_mbs, 1),
        "tcp_MBps": round(tcp_mbs, 1),
        "ratio": round(p2p_mbs / tcp_mbs, 3),
        "receiver_peak_rss_MB": round(p2p["peak_rss_mb"], 1),
        "receiver_rss_growth_MB": round(p2p["rss_after_mb"] - p2p["rss_before_mb"], 1),
    }))


if __name__ == "__main__":
    main()
