"""Run a node that serves its store until cancelled (`polnet p2p serve`, test providers).

`python -m node.p2p.serve --home DIR [--listen MADDR] [--bootstrap MADDR]...
[--provide ID]... [--rate BYTES_PER_S]` prints one JSON line {"peer_id", "addrs"}
on stdout once listening, then serves until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Sequence

import trio

from node.p2p.config import NodeConfig
from node.p2p.host import PolnetNode


async def serve(config: NodeConfig, provide: Sequence[str] = (),
                on_ready: Callable[[PolnetNode], None] | None = None) -> None:
    async with PolnetNode(config) as node:
        for aid in provide or node.store.ids():
            try:
                await node.provide(aid)
            except Exception as exc:  # no DHT peers yet: still serve direct requests
                print(f"provide {aid[:12]} failed: {exc!r}", file=sys.stderr)
        if on_ready is not None:
            on_ready(node)
        await trio.sleep_forever()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--home", required=True)
    ap.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    ap.add_argument("--bootstrap", action="append", default=[])
    ap.add_argument("--provide", action="append", default=[])
    ap.add_argument("--rate", type=float, default=None, help="bytes/s per peer")
    args = ap.parse_args(argv)
    cfg = NodeConfig.in_dir(args.home, listen=args.listen, bootstrap=args.bootstrap)
    if args.rate:
        cfg.serve.bytes_per_second_per_peer = args.rate

    def ready(node: PolnetNode) -> None:
        print(json.dumps({"peer_id": node.peer_id.to_base58(), "addrs": node.addrs}), flush=True)

    from node import logs  # noqa: PLC0415

    logs.configure(level="WARNING")
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve, cfg, args.provide, ready)


if __name__ == "__main__":
    main()
