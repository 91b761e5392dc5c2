"""Providers in separate OS processes, killed mid-transfer: failover and resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from node.errors import PeerUnavailable
from node.p2p import NodeConfig, PolnetNode
from node.store import ArtifactStore
from node.store.manifest import MiB

ROOT = Path(__file__).resolve().parents[1]
RATE = 3 * MiB  # per-peer serving rate: slow enough to kill a provider mid-way


class Provider:
    """`python -m node.p2p.serve` in its own process (same home = same identity)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.proc: subprocess.Popen[str] | None = None
        self.addr = ""

    async def start(self) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "node.p2p.serve", "--home", str(self.home),
             "--rate", str(RATE)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        assert self.proc.stdout is not None
        line = await trio.to_thread.run_sync(self.proc.stdout.readline)
        self.addr = json.loads(line)["addrs"][0]
        return self.addr

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def providers(tmp_path: Path):  # type: ignore[no-untyped-def]
    made: list[Provider] = []

    def make(name: str, data: bytes) -> Provider:
        ArtifactStore(tmp_path / name / "store").put_bytes(data)
        made.append(Provider(tmp_path / name))
        return made[-1]

    yield make
    for p in made:
        p.kill()


def _kill_after(provider: Provider, threshold: int):  # type: ignore[no-untyped-def]
    def progress(done: int, total: int) -> None:
        if done >= threshold:
            provider.kill()
    return progress


def test_failover_to_second_provider(tmp_path: Path, providers) -> None:  # type: ignore[no-untyped-def]
    data = os.urandom(12 * MiB)
    p1, p2 = providers("p1", data), providers("p2", data)

    async def main() -> None:
        with trio.fail_after(90):
            a1, a2 = await p1.start(), await p2.start()
            async with PolnetNode(NodeConfig.in_dir(tmp_path / "f")) as node:
                aid = ArtifactStore(tmp_path / "p1" / "store").ids()[0]
                stats = await node.fetch(aid, peers=[a1, a2], progress=_kill_after(p1, 3 * MiB))
                assert node.store.path(aid).read_bytes() == data
                assert p1.proc is not None and p1.proc.poll() is not None  # it did die
                assert stats.failed_peers  # p1's streams broke, p2 finished the job
                assert sum(stats.chunks_fetched.values()) == 12

    trio.run(main)


def test_resume_when_provider_returns(tmp_path: Path, providers) -> None:  # type: ignore[no-untyped-def]
    data = os.urandom(10 * MiB)
    p1 = providers("p1", data)

    async def main() -> None:
        with trio.fail_after(90):
            a1 = await p1.start()
            aid = ArtifactStore(tmp_path / "p1" / "store").ids()[0]
            async with PolnetNode(NodeConfig.in_dir(tmp_path / "f")) as node:
                with pytest.raises(PeerUnavailable):
                    await node.fetch(aid, peers=[a1], progress=_kill_after(p1, 3 * MiB))
                assert not node.store.has(aid)
                a1 = await p1.start()  # back, same identity, new port
                stats = await node.fetch(aid, peers=[a1])
                assert node.store.path(aid).read_bytes() == data
                assert stats.resumed_chunks >= 3
                assert stats.resumed_chunks + sum(stats.chunks_fetched.values()) == 10

    trio.run(main)
