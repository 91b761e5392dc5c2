"""New heads pushed by the provider (``eth_subscribe newHeads`` over a WebSocket), so
an idle node stops asking for the block number twice a second.

Where a provider offers a WebSocket endpoint (``[rpc] ws_url``), a
:class:`HeadSubscription` holds one connection on its own thread (web3's
``WebSocketProvider`` is asyncio; the node is trio) and keeps the newest head it was
told of. :class:`node.chain.view.ChainView` then reads the head from it and makes a
request only when a block arrived, plus one ``eth_blockNumber`` every
``check_every`` seconds: a subscription can go quiet without an error (a proxy's
idle timeout, a provider's restart), and a chain that moved on without it marks it
stale, so it reconnects. Until the first head after a (re)connection, and whenever
the socket is down, the view asks over HTTP as before: a lost WebSocket never stops
a node. Everything else (logs, calls, transactions) stays on the HTTP endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from web3 import AsyncWeb3, WebSocketProvider

from node.chain.rpc import RpcSettings, backoff_delay
from node.logs import get_logger

log = get_logger("polnet.chain.heads")

CHECK_EVERY_S = 30.0  # one HTTP eth_blockNumber at least this often while subscribed


class HeadSubscription:
    """``head()``: the newest block number the socket announced, or None while it is
    not subscribed (the caller asks over HTTP). Thread-safe."""

    def __init__(self, url: str, settings: RpcSettings | None = None,
                 check_every: float = CHECK_EVERY_S) -> None:
        if not url.startswith(("ws://", "wss://")):
            raise ValueError(f"{url!r} is not a WebSocket URL (ws:// or wss://)")
        self.url = url
        self.settings = settings or RpcSettings()
        self.check_every = check_every
        self._lock = threading.Lock()
        self._head: int | None = None
        self._stale = False
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, name="polnet-heads", daemon=True)
        self.heads_seen = 0    # notifications taken in (tests, metrics)
        self.connections = 0   # subscriptions made, reconnections included

    def start(self) -> HeadSubscription:
        self._thread.start()
        return self

    def head(self) -> int | None:
        with self._lock:
            return self._head

    def mark_stale(self, behind: int) -> None:
        """The chain is ``behind`` blocks past the last head we were told of (or, < 0,
        before it): the socket lost notifications; drop it and subscribe again."""
        with self._lock:
            self._head, self._stale = None, True
        log.warning("head_subscription_stale", url=self.url, behind=behind)
        self._cancel()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._cancel()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _cancel(self) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(task.cancel)

    # --- the socket's thread ---------------------------------------------------------

    def _main(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._task = loop.create_task(self._follow())
                loop.run_until_complete(self._task)
                attempt = 0
            except asyncio.CancelledError:
                attempt = 0  # marked stale (or closing): reconnect at once
            except Exception as exc:  # noqa: BLE001 - any failure: HTTP meanwhile, retry
                attempt += 1
                if attempt == 1:
                    log.warning("head_subscription_down", url=self.url,
                                error=str(exc)[:300], fallback="http eth_blockNumber")
            finally:
                with self._lock:
                    self._head = None
                self._task = None
                loop.close()
            if attempt:
                self._stop.wait(backoff_delay(self.settings, attempt - 1))

    async def _follow(self) -> None:
        # One connection attempt here: the retries, with the node's backoff, are _main's.
        async with AsyncWeb3(WebSocketProvider(self.url, max_connection_retries=1)) as w3:
            await w3.eth.subscribe("newHeads")
            self.connections += 1
            with self._lock:
                if self._stale:
                    log.info("head_subscription_renewed", url=self.url)
                self._stale = False
            async for msg in w3.socket.process_subscriptions():
                number = _number(msg)
                if number is None:
                    continue
                with self._lock:
                    self._head = number  # lower after a reorg: the view rebuilds
                    self.heads_seen += 1
                if self._stop.is_set():
                    return
        raise ConnectionError("the provider ended the subscription")


def _number(msg: Any) -> int | None:
    try:
        n = msg["result"]["number"]
        return int(n, 16) if isinstance(n, str) else int(n)
    except (KeyError, TypeError, ValueError):
        return None
