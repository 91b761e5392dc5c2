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
from node.p2p import PolnetNode
from node.store import ArtifactStore
from node.store.manifest import MiB

ROOT = Path(__file__).resolve().parents[1]
RATE = 3 * MiB  # per-peer serving rate: slow enough to kill a provider mid-way


def node_store(root: Path, name: str) -> ArtifactStore:
    """The store `polnet ... --name NAME` uses under POLNET_HOME=root."""
    return ArtifactStore(root / "nodes" / name / "p2p" / "store")


class Provider:
    """`polnet p2p serve --name NAME` in its own process (same name = same identity); its
    serving rate comes from the environment, through the settings' p2p section."""

    def __init__(self, root: Path, name: str) -> None:
        self.root, self.name = root, name
        self.proc: subprocess.Popen[str] | None = None
        self.addr = ""

    async def start(self) -> str:
        env = {**os.environ, "POLNET_HOME": str(self.root),
               "POLNET_P2P__SERVE__BYTES_PER_SECOND_PER_PEER": str(RATE)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli.main", "--log-level", "WARNING", "p2p", "serve",
             "--json", "--name", self.name], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env)
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
        node_store(tmp_path, name).put_bytes(data)
        made.append(Provider(tmp_path, name))
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
            async with PolnetNode(tmp_path / "f") as node:
                aid = node_store(tmp_path, "p1").ids()[0]
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
            aid = node_store(tmp_path, "p1").ids()[0]
            async with PolnetNode(tmp_path / "f") as node:
                with pytest.raises(PeerUnavailable):
                    await node.fetch(aid, peers=[a1], progress=_kill_after(p1, 3 * MiB))
                assert not node.store.has(aid)
                a1 = await p1.start()  # back, same identity, new port
                stats = await node.fetch(aid, peers=[a1])
                assert node.store.path(aid).read_bytes() == data
                assert stats.resumed_chunks >= 3
                assert stats.resumed_chunks + sum(stats.chunks_fetched.values()) == 10

    trio.run(main)
