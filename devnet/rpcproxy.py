"""A throttling JSON-RPC proxy for tests: what a real provider does to a node, in front
of a real anvil.

Each request is forwarded to the upstream node unless the proxy's :class:`Throttle`
picks one of the provider's failures for it: HTTP 429, JSON-RPC -32005 ("limit
exceeded", HTTP 200), JSON-RPC -32000 "header not found" (a load-balanced node behind
its peers), JSON-RPC -32603 "internal error" (not transient: the caller must cope), a
stall (held ``stall_s`` before it is forwarded, so a client that gave up
may find its request executed anyway), or a reset connection. ``burst(n)`` answers
the next ``n`` requests 429; ``stall_next(method)`` stalls the next call of one
method; ``fail_next(method, n)`` answers its next ``n`` calls -32603. Everything it
did is counted (:attr:`RpcProxy.counts`).
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Throttle:
    """Fractions of requests (0..1) answered with each failure; the rest are forwarded."""

    p429: float = 0.0
    p32005: float = 0.0
    p_header: float = 0.0  # -32000 "header not found"
    p_internal: float = 0.0  # -32603 "internal error"
    p_stall: float = 0.0
    p_reset: float = 0.0
    stall_s: float = 2.0
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def pick(self) -> str:
        x = self._rng.random()
        for kind, p in (("429", self.p429), ("-32005", self.p32005),
                        ("-32000", self.p_header), ("-32603", self.p_internal),
                        ("stall", self.p_stall),
                        ("reset", self.p_reset)):
            if x < p:
                return kind
            x -= p
        return "forward"


def _error(req: Any, code: int, message: str) -> Any:
    if isinstance(req, list):
        return [_error(r, code, message) for r in req]
    rid = req.get("id") if isinstance(req, dict) else None
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def _methods(req: Any) -> list[str]:
    reqs = req if isinstance(req, list) else [req]
    return [str(r.get("method")) for r in reqs if isinstance(r, dict)]


class _Handler(BaseHTTPRequestHandler):
    server: RpcProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            req = json.loads(body)
        except ValueError:
            req = None
        kind = self.server.decide(_methods(req))
        if kind == "429":
            self._answer(429, b"Too Many Requests\n", "text/plain", close=True)
        elif kind == "-32005":
            self._json(_error(req, -32005, "request rate exceeded, retry later"))
        elif kind == "-32000":
            self._json(_error(req, -32000, "header not found"))
        elif kind == "-32603":
            self._json(_error(req, -32603, "internal error"))
        elif kind == "reset":
            # SO_LINGER 0: close sends RST, what a provider's dropped connection looks like
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
        else:
            if kind == "stall":
                time.sleep(self.server.throttle.stall_s)
            status, data = self.server.forward(body)
            try:
                self._answer(status, data, "application/json")
            except OSError:
                self.close_connection = True  # the client gave up waiting

    def _json(self, obj: Any) -> None:
        self._answer(200, json.dumps(obj).encode(), "application/json")

    def _answer(self, status: int, data: bytes, ctype: str, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)


class RpcProxy(ThreadingHTTPServer):
    """``RpcProxy(upstream_url, Throttle(...)).start()``; point clients at ``.url``."""

    daemon_threads = True

    def __init__(self, upstream: str, throttle: Throttle | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self.throttle = throttle or Throttle()
        self.counts: Counter[str] = Counter()  # "429", "stall", ..., "forward", "total"
        self.methods: Counter[str] = Counter()  # forwarded, by JSON-RPC method
        self.arrivals: list[float] = []  # monotonic time of each request
        self._burst = 0
        self._stall_methods: set[str] = set()
        self._fail_methods: Counter[str] = Counter()  # method -> -32603 answers still due
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> RpcProxy:
        threading.Thread(target=self.serve_forever, name="rpc-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (it timed out, or we reset it): nothing to report

    def burst(self, n: int) -> None:
        """Answer the next ``n`` requests HTTP 429, whatever the throttle says."""
        with self._lock:
            self._burst = n

    def stall_next(self, method: str) -> None:
        """Hold the next request for ``method`` ``throttle.stall_s`` before forwarding it."""
        with self._lock:
            self._stall_methods.add(method)

    def fail_next(self, method: str, n: int) -> None:
        """Answer the next ``n`` requests for ``method`` -32603 "internal error" (what a
        provider's sick backend answers; no retry of the RPC layer hides it)."""
        with self._lock:
            self._fail_methods[method] = n

    def burst_left(self) -> int:
        with self._lock:
            return self._burst

    def decide(self, methods: list[str]) -> str:
        with self._lock:
            self.arrivals.append(time.monotonic())
            self.counts["total"] += 1
            if self._burst > 0:
                self._burst -= 1
                kind = "429"
            elif any(self._fail_methods[m] > 0 for m in methods):
                for m in methods:
                    if self._fail_methods[m] > 0:
                        self._fail_methods[m] -= 1
                        break
                kind = "-32603"
            elif self._stall_methods.intersection(methods):
                self._stall_methods.difference_update(methods)
                kind = "stall"
            else:
                kind = self.throttle.pick()
            self.counts[kind] += 1
            if kind in ("forward", "stall"):
                self.methods.update(methods)
            return kind

    def forward(self, body: bytes) -> tuple[int, bytes]:
        req = urllib.request.Request(self.upstream, data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - loopback anvil
                return int(r.status), r.read()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read()


__all__ = ["RpcProxy", "Throttle"]
