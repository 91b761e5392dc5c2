"""js-libp2p (Node) dials our node over TCP+Noise+Yamux, pings, and fetches an artifact."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from node.p2p import PolnetNode
from node.store.manifest import MiB

INTEROP = Path(__file__).resolve().parent / "interop"


def _js_ready() -> str | None:
    """None when the js peer can run, else the reason to skip."""
    if not shutil.which("node") or not shutil.which("npm"):
        return "node/npm not installed"
    if not (INTEROP / "node_modules" / "libp2p").is_dir():
        r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=INTEROP, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return f"npm ci in tests/interop failed: {r.stderr.strip()[-300:]}"
    return None


def test_js_peer_pings_and_fetches(tmp_path: Path) -> None:
    reason = _js_ready()
    if reason:
        pytest.skip(reason)
    data = os.urandom(2 * MiB + 1000)

    async def main() -> dict[str, object]:
        with trio.fail_after(90):
            async with PolnetNode(tmp_path / "py") as node:
                aid = node.store.put_bytes(data)
                r = await trio.run_process(
                    ["node", "peer.mjs", node.addrs[0], aid], cwd=INTEROP,
                    capture_stdout=True, capture_stderr=True, check=False)
                out = r.stdout.decode().strip().splitlines()
                assert out, r.stderr.decode()[-2000:]
                return dict(json.loads(out[-1]))

    res = trio.run(main)
    assert res.get("ok") is True, res
    assert res["sha256"] == hashlib.sha256(data).hexdigest()
    assert isinstance(res["ping_ms"], (int, float))
