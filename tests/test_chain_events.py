"""EventWatcher: exactly-once delivery across watcher restarts and RPC outages."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from devnet.anvil import dev_accounts, start_anvil
from node.chain.bound import Bound
from node.chain.client import ChainClient
from node.chain.events import ChainEvent, EventWatcher


def _transfers(tok, to: str, amounts: range) -> None:  # type: ignore[no-untyped-def]
    for a in amounts:
        tok.transfer(to, a)


def _amounts(events: list[ChainEvent]) -> list[int]:
    return [e.args["value"] for e in events if e.event == "Transfer"]


def test_restarted_watcher_resumes_exactly_once(tmp_path: Path) -> None:
    node = start_anvil(accounts=2)
    try:
        a, b = dev_accounts(2)
        c = ChainClient(node.url, a)
        tok = c.deploy("PolToken")
        tok.mint(a.address, 10**6)
        cursor = tmp_path / "cursor.json"
        seen: list[ChainEvent] = []

        w = EventWatcher(c.w3, [tok], cursor_path=cursor, max_range=3)
        _transfers(tok, b.address, range(1, 6))
        w.poll(seen.append)

        # events while no watcher runs, then a handler that crashes part-way
        _transfers(tok, b.address, range(6, 11))
        boom = {"left": 2}

        def flaky(ev: ChainEvent) -> None:
            if ev.event == "Transfer" and boom["left"] == 0:
                raise RuntimeError("handler crashed")
            boom["left"] -= ev.event == "Transfer"
            seen.append(ev)

        w2 = EventWatcher(c.w3, [tok], cursor_path=cursor, max_range=3)
        with pytest.raises(RuntimeError):
            w2.poll(flaky)
        w3_ = EventWatcher(c.w3, [tok], cursor_path=cursor, max_range=3)
        _transfers(tok, b.address, range(11, 13))
        w3_.poll(seen.append)
        assert _amounts(seen) == [10**6, *range(1, 13)]
        keys = [e.key for e in seen]
        assert len(keys) == len(set(keys))
        assert w3_.poll(seen.append) == []
    finally:
        node.stop()


def test_watcher_survives_rpc_outage(tmp_path: Path) -> None:
    state = tmp_path / "anvil-state.json"
    node = start_anvil(accounts=2, state=state)
    port = node.port
    stop = threading.Event()
    thread: threading.Thread | None = None
    try:
        a, b = dev_accounts(2)
        c = ChainClient(node.url, a)
        tok = c.deploy("PolToken")
        tok.mint(a.address, 10**6)
        seen: list[ChainEvent] = []
        w = EventWatcher(ChainClient(node.url).w3, [tok], cursor_path=tmp_path / "cur.json")
        thread = threading.Thread(target=w.run, args=(seen.append, stop),
                                  kwargs={"interval": 0.05, "max_backoff": 0.3}, daemon=True)
        thread.start()
        _transfers(tok, b.address, range(1, 4))
        _wait_for(lambda: len(_amounts(seen)) >= 4)  # mint + 3

        node.stop()  # the RPC goes away; anvil dumps its state on the way out
        time.sleep(0.5)  # the watcher hits the outage and backs off
        node = start_anvil(port, accounts=2, state=state)
        c2 = ChainClient(node.url, a)
        tok2: Bound = c2.contract("PolToken", tok.address)
        _transfers(tok2, b.address, range(4, 8))  # emitted while the watcher was backing off
        _wait_for(lambda: len(_amounts(seen)) >= 8)
        time.sleep(0.3)  # room for any duplicate to show up
        assert _amounts(seen) == [10**6, *range(1, 8)]
        assert len({e.key for e in seen}) == len(seen)
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
        node.stop()


def _wait_for(cond, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for events")
