"""`polnet explorer`'s HTTP server: read-only pages over a :class:`ChainIndex`.

The standard library's threaded HTTP server, bound to loopback by default: the
explorer is a separate process from the node daemons (their one trio loop is not
shared), GET/HEAD only, and every page is built from one snapshot per chain head.

A thread serves each connection, so a connection costs a thread for as long as it
lives: every socket read has a timeout (an idle keep-alive connection is closed after
it), a request's line and headers must all arrive within ``request_deadline`` (a
client trickling bytes cannot hold its thread either), and at most
``max_connections`` are served at once (the rest are answered 503 and closed), so a
few hundred idle sockets cannot grow the process without bound.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Container
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from node.chain.ids import JobId
from node.errors import ConfigError, PolnetError
from node.explorer import pages
from node.explorer.index import ChainIndex, Snapshot
from node.logs import get_logger

log = get_logger("polnet.explorer")

# No scripts, no remote anything: the pages are static HTML with inline CSS and SVG.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'"
MAX_PATH = 200
READ_TIMEOUT_S = 10.0  # per socket read: an idle connection is closed after this
REQUEST_DEADLINE_S = 20.0  # a request's line and headers, however slowly they trickle
MAX_CONNECTIONS = 64  # served at once; each holds a thread
_BUSY_BODY = b"too many connections, try again\n"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close"
         b"\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the explorer on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve to anything


def check_bind(host: str, public: bool) -> str | None:
    """Refuse a bind beyond loopback unless ``public``; returns the warning to print then."""
    if is_loopback(host):
        return None
    if not public:
        raise ConfigError(f"--host {host} would serve the explorer beyond this machine (it "
                          "shows every node's peer id and addresses, and each connection "
                          "costs a thread): keep the default 127.0.0.1, or pass --public if "
                          "you mean to")
    return (f"warning: the explorer listens on {host}, reachable from other machines "
            f"({MAX_CONNECTIONS} connections at most, idle ones closed after "
            f"{READ_TIMEOUT_S:.0f} s); put a reverse proxy in front for anything public")


class _Handler(BaseHTTPRequestHandler):
    server: ExplorerServer
    protocol_version = "HTTP/1.1"

    def handle_one_request(self) -> None:
        self.server.reading(self.connection, True)  # the request's clock starts
        try:
            super().handle_one_request()
        finally:
            self.server.reading(self.connection, False)

    def parse_request(self) -> bool:
        ok = super().parse_request()  # the request line and headers are in
        self.server.reading(self.connection, False)
        return ok

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._serve(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(head=True)

    def do_POST(self) -> None:  # noqa: N802
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain", b"read-only\n", False)

    do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("explorer_request", line=format % args)

    def _serve(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        if len(path) > MAX_PATH:
            self._send(HTTPStatus.REQUEST_URI_TOO_LONG, "text/plain", b"path too long\n", head)
            return
        try:
            snap = self.server.index.snapshot()
            status, ctype, body = self.server.route(snap, path)
        except PolnetError as exc:  # the chain went away: say so, keep serving
            log.warning("explorer_chain_error", error=str(exc))
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain",
                       f"chain unavailable: {exc}\n".encode(), head)
            return
        self._send(status, ctype, body.encode(), head)

    def _send(self, status: HTTPStatus, ctype: str, body: bytes, head: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(body)


_ROUTES = [
    (re.compile(r"^/$"), "jobs"),
    (re.compile(r"^/job/(\d{1,12})$"), "job"),
    (re.compile(r"^/disputes$"), "disputes"),
    (re.compile(r"^/dispute/(\d{1,12})$"), "dispute"),
    (re.compile(r"^/collabs$"), "collabs"),
    (re.compile(r"^/collab/(\d{1,12})$"), "collab"),
    (re.compile(r"^/juries$"), "juries"),
    (re.compile(r"^/jury/(\d{1,12})$"), "jury"),
    (re.compile(r"^/nodes$"), "nodes"),
    (re.compile(r"^/node/(0x[0-9a-fA-F]{40})$"), "node"),
    (re.compile(r"^/api/summary\.json$"), "summary"),
]


class ExplorerServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # accepted promptly anyway; the cap is MAX_CONNECTIONS

    def __init__(self, index: ChainIndex, host: str = "127.0.0.1", port: int = 0, *,
                 public: bool = False, read_timeout: float = READ_TIMEOUT_S,
                 request_deadline: float = REQUEST_DEADLINE_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.warning = check_bind(host, public)  # raises ConfigError before binding
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is already in use (another explorer?):"
                                  " pick another with --port, or --port 0 for any free "
                                  "one") from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick "
                              "another --host or --port") from None
        self.index = index
        self.read_timeout = read_timeout
        self.request_deadline = request_deadline
        self._reading: dict[socket.socket, float] = {}  # connection -> when its request began
        self._reading_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._thread: threading.Thread | None = None

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve in a thread while a slot is free; otherwise answer 503 and close at once
        (from the accept loop, so without blocking: a full socket buffer drops the 503)."""
        if not self._slots.acquire(blocking=False):
            log.warning("explorer_busy", client=str(client_address[0]))
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        request.settimeout(self.read_timeout)  # http.server times out reads with this
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def reading(self, conn: socket.socket, started: bool) -> None:
        with self._reading_lock:
            if started:
                self._reading[conn] = time.monotonic()
            else:
                self._reading.pop(conn, None)

    def service_actions(self) -> None:
        """Between accepts (every 0.5 s): end connections whose request has not arrived
        within the deadline. The read timeout alone lets a client that sends a byte
        every few seconds (slowloris) hold a slot forever."""
        now = time.monotonic()
        with self._reading_lock:
            late = [c for c, t in self._reading.items() if now - t > self.request_deadline]
            for c in late:
                del self._reading[c]
        for c in late:
            log.warning("explorer_request_too_slow", deadline_s=self.request_deadline)
            with contextlib.suppress(OSError):  # its thread's read returns; the thread ends
                c.shutdown(socket.SHUT_RDWR)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ExplorerServer:
        """Serve in a background thread (tests, the demo); `serve_forever` otherwise."""
        self._thread = threading.Thread(target=self.serve_forever, name="explorer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def route(self, snap: Snapshot, path: str) -> tuple[HTTPStatus, str, str]:
        html = "text/html"
        for rx, name in _ROUTES:
            m = rx.match(path)
            if m is None:
                continue
            if name in _LISTS:
                return HTTPStatus.OK, html, _LISTS[name](snap)
            if name in _BY_ID:
                key = int(m.group(1))
                held, what, page = _BY_ID[name]
                if key not in held(snap):
                    return HTTPStatus.NOT_FOUND, html, pages.not_found(snap, f"no {what} {key}")
                return HTTPStatus.OK, html, page(snap, key)
            if name == "summary":
                return HTTPStatus.OK, "application/json", json.dumps(_summary(snap))
            if name == "job":
                return self._job(snap, JobId(int(m.group(1))))
            addr = next((a for a in snap.nodes if a.lower() == m.group(1).lower()), None)
            if addr is None:
                return HTTPStatus.NOT_FOUND, html, pages.not_found(snap, "no such node")
            return HTTPStatus.OK, html, pages.node_page(snap, snap.nodes[addr])
        return HTTPStatus.NOT_FOUND, html, pages.not_found(snap, "no such page")

    def _job(self, snap: Snapshot, jid: JobId) -> tuple[HTTPStatus, str, str]:
        if jid not in snap.jobs:
            return HTTPStatus.NOT_FOUND, "text/html", pages.not_found(
                snap, f"no job {jid}: the market has {snap.job_count}")
        j = snap.jobs[jid]
        m = self.index.c.market
        sampled = m.sampled_segments(jid) if j.seed != bytes(32) else []  # kept once final
        committee = [str(a) for a in m.committee_of(jid)] if j.round else []
        attestors = [str(a) for a in m.attestors_of(jid)] if j.round else []
        curve = self.index.loss_curve(jid, j)
        return HTTPStatus.OK, "text/html", pages.job_page(snap, jid, curve, sampled, committee,
                                                          attestors, self.index.spec_name(
                                                              j.spec_hash))


# Pages that list one kind of record, and pages of one record by its id: (the ids the
# snapshot holds, what a missing one is called, the page).
_LISTS: dict[str, Callable[[Snapshot], str]] = {
    "jobs": pages.jobs_page, "disputes": pages.disputes_page, "nodes": pages.nodes_page,
    "collabs": pages.collabs_page, "juries": pages.juries_page}
_ById = tuple[Callable[[Snapshot], Container[int]], str, Callable[[Snapshot, Any], str]]
_BY_ID: dict[str, _ById] = {
    "dispute": (lambda s: s.disputes, "dispute", pages.dispute_page),
    "collab": (lambda s: s.collabs, "collaborative job", pages.collab_page),
    "jury": (lambda s: s.juries, "outer jury case", pages.jury_page)}

def _summary(snap: Snapshot) -> dict[str, Any]:
    return {"chain_id": snap.chain_id, "head": snap.head, "jobs": {
        str(i): {"status": j.status.name.lower(), "reward": str(j.reward), "solver": j.solver,
                 "round": j.round, "disputes": [d.id for d in snap.disputes_of(i)],
                 "paid": str(sum(p["amount"] for p in snap.payouts(i)))}
        for i, j in snap.jobs.items()}, "disputes": {
        str(d.id): {"job": d.job_id, "verdict": d.verdict.name.lower(), "range": [d.lo, d.hi]}
        for d in snap.disputes.values()}, "collabs": {
        str(i): {"status": j.status.name.lower(), "round": j.round, "rounds": j.rounds,
                 "sub_jobs": [list(r.sub_jobs) for r in snap.rounds.get(i, [])],
                 "juries": [c.id for c in snap.juries_of(i)]}
        for i, j in snap.collabs.items()}, "nodes": {
        a: {"slashed": str(n.slashed), "jobs_solved": n.jobs_solved}
        for a, n in snap.nodes.items()}}
