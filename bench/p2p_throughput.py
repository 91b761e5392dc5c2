"""Artifact transfer throughput: our protocol vs a plain TCP copy, separate processes, loopback.

Usage: python bench/p2p_throughput.py [--mb 256] [--reps 2]
The last stdout line is JSON: p2p and tcp MB/s, their ratio, and the receiving
process's peak RSS and its growth over the transfer; then, in the same run:

- `slow_*`: the same fetch from one honest provider and one that answers and
  then trickles 1 byte/s, against the honest provider alone (target: <= 2x);
- `two_honest_*`: throughput from two honest providers against one (target:
  >= 1.5x; every provider and the receiver share this machine's cores, so on a
  small machine the CPU, not the network, sets the ceiling).
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


def receive_p2p(addrs: str, aid: str, home: str) -> dict[str, float]:
    import trio  # noqa: PLC0415

    from node.p2p import P2PSettings, PolnetNode  # noqa: PLC0415

    out: dict[str, float] = {}
    peers = addrs.split(",")

    async def main() -> None:
        cfg = P2PSettings(streams_per_peer=int(os.environ.get("BENCH_STREAMS", "1")))
        async with PolnetNode(home, cfg) as node:
            for addr in peers:
                await node.connect(addr)
            out["rss_before_mb"] = rss_mb()
            t = time.perf_counter()
            stats = await node.fetch(aid, peers=peers, provide=False)
            out["seconds"] = time.perf_counter() - t
            out["rss_after_mb"] = rss_mb()
            out["reissued_chunks"] = stats.reissued_chunks
            out["peers_used"] = len(stats.chunks_fetched)

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


def serve_slow(home: str) -> None:
    """A provider that answers manifests, then sends every chunk at 1 byte/s."""
    import trio  # noqa: PLC0415

    from devnet.testing import trickle_handler  # noqa: PLC0415
    from node.p2p import PolnetNode  # noqa: PLC0415
    from node.p2p.wire import PROTOCOL_ID  # noqa: PLC0415

    async def main() -> None:
        async with PolnetNode(home) as node:
            node.host.set_stream_handler(PROTOCOL_ID, trickle_handler(node))
            print(json.dumps({"addrs": node.addrs}), flush=True)
            await trio.sleep_forever()

    from node import logs  # noqa: PLC0415

    logs.configure(level="WARNING")
    trio.run(main)


def child(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2, help="p2p runs per scenario (best kept)")
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
    if a.role == "serve-slow":
        serve_slow(a.rest[0])
        return

    from node.store import ArtifactStore  # noqa: PLC0415

    size = a.mb * 1_000_000
    with tempfile.TemporaryDirectory(prefix="polnet-bench-") as tmp:
        src = Path(tmp) / "src.bin"
        with open(src, "wb") as fh:
            for _ in range(size // BLOCK):
                fh.write(os.urandom(BLOCK))
            fh.write(os.urandom(size % BLOCK))
        # `polnet p2p serve --name N` serves POLNET_HOME/nodes/N/p2p/store.
        node_store = Path(tmp) / "nodes" / "{}" / "p2p" / "store"
        aid = ArtifactStore(str(node_store).format("prov")).put_file(src)
        # a second honest copy, and the slow provider's
        assert ArtifactStore(str(node_store).format("prov2")).put_file(src) == aid
        assert ArtifactStore(Path(tmp) / "slow" / "store").put_file(src) == aid
        procs: list[subprocess.Popen[str]] = []
        env = {**os.environ, "POLNET_HOME": tmp}

        def start(args: list[str]) -> str:
            procs.append(subprocess.Popen(args, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, env=env))
            assert procs[-1].stdout is not None
            return str(json.loads(procs[-1].stdout.readline())["addrs"][0])

        def fetch(addrs: list[str], home: str) -> dict[str, float]:
            r = child(["--role", "recv-p2p", ",".join(addrs), aid, str(Path(tmp) / home)])
            out: dict[str, float] = json.loads(r.communicate(timeout=600)[0].strip()
                                               .splitlines()[-1])
            got = ArtifactStore(Path(tmp) / home / "store")
            assert got.has(aid), f"p2p transfer into {home} did not complete"
            got.path(aid).unlink()
            return out

        try:
            serve = [sys.executable, "-m", "node.cli.main", "--log-level", "WARNING", "p2p",
                     "serve", "--json", "--name"]
            addr = start([*serve, "prov"])
            addr2 = start([*serve, "prov2"])
            slow_addr = start([sys.executable, __file__, "--role", "serve-slow",
                               str(Path(tmp) / "slow")])
            # Interleaved and best of --reps: on a shared machine one run is noise.
            runs: dict[str, list[dict[str, float]]] = {"one": [], "slow": [], "two": []}
            for _ in range(a.reps):
                runs["one"].append(fetch([addr], "recv"))
                runs["slow"].append(fetch([slow_addr, addr], "recv-slow"))
                runs["two"].append(fetch([addr, addr2], "recv-two"))
            p2p, slow, two = (min(runs[k], key=lambda r: r["seconds"])
                              for k in ("one", "slow", "two"))
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()

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
        "honest_alone_s": round(p2p["seconds"], 2),
        "slow_plus_honest_s": round(slow["seconds"], 2),
        "slow_vs_alone": round(slow["seconds"] / p2p["seconds"], 2),
        "slow_reissued_chunks": int(slow["reissued_chunks"]),
        "two_honest_MBps": round(size / 1e6 / two["seconds"], 1),
        "two_honest_vs_one": round(p2p["seconds"] / two["seconds"], 2),
        "two_honest_peers_used": int(two["peers_used"]),
        "reps": a.reps,
        "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
