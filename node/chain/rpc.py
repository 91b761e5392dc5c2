"""Connecting to a JSON-RPC endpoint, and turning transport failures into RpcUnavailable.

A real provider throttles: it answers HTTP 429 (or 502/503/504 behind a load
balancer), or JSON-RPC error -32005 / a "rate limit" message (or a lagging backend's
"header not found"), stalls past the timeout, or resets the connection.
:class:`ResilientHTTPProvider` retries each of
these with exponential backoff and jitter (honouring ``Retry-After``) and, once the
retries are spent, raises :class:`RpcUnavailable`, the one error callers handle. It
also keeps a request budget per second (:class:`RpcSettings.rate`), so a node spends
its provider's allowance evenly instead of in bursts that get it throttled.

A refused connection is not retried here: on loopback it means the devnet is down,
and the user should hear so at once (the daemons wait out outages themselves).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from typing import Any

import requests
from eth_utils import keccak
from pydantic import BaseModel, ConfigDict, Field
from web3 import Web3
from web3.exceptions import ContractLogicError, ProviderConnectionError, Web3Exception
from web3.providers.rpc import HTTPProvider
from web3.types import RPCEndpoint, RPCResponse

from node.errors import ContractRevert, RpcUnavailable, TransactionFailed
from node.logs import get_logger

log = get_logger("polnet.chain.rpc")

DEVNET_HINT = "is the devnet up? run `polnet devnet up`"

# Exceptions that mean "could not talk to the node", as opposed to the node saying no.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.HTTPError,
    ProviderConnectionError,
    ConnectionError,
)

#: What a daemon's loop outlives (logged, then the next pass retries): the chain could
#: not be reached, or its node answered with an error that is not a contract's.
RPC_FAILURES: tuple[type[BaseException], ...] = (RpcUnavailable, *TRANSPORT_ERRORS,
                                                 Web3Exception)

#: HTTP statuses a throttling provider or its load balancer answers: worth a retry.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
#: JSON-RPC error codes for "slow down": -32005 (EIP-1474 "limit exceeded"), 429, -32029.
RATE_LIMIT_CODES = frozenset({-32005, -32029, 429})
# ... and the transient answers of a load-balanced provider: "header not found" is a
# backend node a block behind its peers; the same request succeeds on the next try.
_TRANSIENT_TEXT = re.compile(r"rate.?limit|too many requests|exceeded .*(capacity|quota|"
                             r"limit)|request limit|compute units|header not found",
                             re.IGNORECASE)


class RpcSettings(BaseModel):
    """The ``rpc`` section of the node's settings (``[rpc]``, ``POLNET_RPC__RATE``)."""

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(default=0.0, ge=0, description=(
        "Requests per second at most, spread evenly (a provider's allowance); 0: no limit."))
    retries: int = Field(default=6, ge=0, le=20, description=(
        "Retries of a throttled, timed-out or reset request before RpcUnavailable."))
    timeout: float = Field(default=10.0, gt=0, le=600,
                           description="Seconds to wait for one answer.")
    backoff: float = Field(default=0.25, ge=0, le=60, description=(
        "First retry delay (s); doubles each retry, with jitter."))
    max_backoff: float = Field(default=8.0, ge=0, le=600, description="Longest retry delay (s).")
    ws_url: str | None = Field(default=None, pattern=r"^wss?://", description=(
        "The provider's WebSocket endpoint of the same chain (ws:// or wss://): new blocks "
        "are pushed (eth_subscribe newHeads) instead of asked for twice a second; calls, "
        "logs and transactions stay on rpc_url. Unset: HTTP only."))


def backoff_delay(settings: RpcSettings, attempt: int, after: float | None = None) -> float:
    """The wait before retry ``attempt`` (0-based): ``backoff`` doubled each time, capped
    at ``max_backoff``, with jitter (so restarted nodes do not retry in step); at least a
    server's ``Retry-After`` (capped too)."""
    delay = min(settings.max_backoff, settings.backoff * 2 ** attempt) * random.uniform(0.5, 1.5)
    if after is not None:
        delay = max(delay, min(after, settings.max_backoff))
    return delay


class RequestBudget:
    """A token bucket: ``rate`` requests per second, bursts of up to one second's worth.
    Thread-safe; a caller over budget sleeps (outside the lock) until its turn."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._burst = max(1.0, rate)
        self._tokens = self._burst
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> None:
        if self.rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= 1.0  # below zero: a reservation that later callers queue behind
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


class _Retry(Exception):
    """One attempt failed in a way worth retrying (internal)."""

    def __init__(self, reason: str, after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.after = after


def _retry_after(resp: requests.Response | None) -> float | None:
    value = resp.headers.get("Retry-After") if resp is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def is_transient(response: Any) -> bool:
    """Whether a JSON-RPC answer (one, or a batch's) is a provider's "slow down" or a
    transient backend error: worth the same request again, later."""
    if isinstance(response, list):
        return any(is_transient(r) for r in response)
    err = response.get("error") if isinstance(response, dict) else None
    if not isinstance(err, dict):
        return False
    if err.get("code") in RATE_LIMIT_CODES:
        return True
    # code 3 is a revert: its text is the contract's, whatever words it contains
    return err.get("code") != 3 and bool(_TRANSIENT_TEXT.search(str(err.get("message", ""))))


# A node's answers that no retry changes: the account, the gas or the chain is wrong.
_PERSON_MUST_FIX = re.compile(r"insufficient funds|revert|intrinsic gas|gas limit|"
                              r"invalid chain id|invalid sender", re.IGNORECASE)


def node_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the transport or of the RPC node (a -32603
    "internal error" answered to a gas estimate or a send, a reset), which the same call
    may get past later, as opposed to a verdict a person must act on: a contract's
    revert (too little stake or tokens), an account without gas money, bad
    configuration (the wrong chain). RpcUnavailable is not counted here: its retries
    are spent already (the provider's, then the daemon's patience)."""
    if isinstance(exc, RpcUnavailable | ContractRevert | ContractLogicError):
        return False
    if isinstance(exc, TransactionFailed):
        return not _PERSON_MUST_FIX.search(str(exc))
    return isinstance(exc, TRANSPORT_ERRORS + (Web3Exception,))


def _refused(exc: BaseException) -> bool:
    """A connection refused outright (nothing listens), as opposed to reset or timed out."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError) or "Connection refused" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__ or (seen.args[0] if seen.args and
                                                      isinstance(seen.args[0], BaseException)
                                                      else None)
    return False


class ResilientHTTPProvider(HTTPProvider):
    """web3's HTTP provider with a request budget and retries of throttling answers,
    timeouts and resets; gives up with :class:`RpcUnavailable`."""

    def __init__(self, endpoint_uri: str, settings: RpcSettings | None = None) -> None:
        self.settings = settings or RpcSettings()
        super().__init__(endpoint_uri, request_kwargs={"timeout": self.settings.timeout},
                         exception_retry_configuration=None)
        self.budget = RequestBudget(self.settings.rate)

    def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        raw_tx = params[0] if method == "eth_sendRawTransaction" and params else None
        return self._with_retries(str(method), lambda: super(ResilientHTTPProvider, self)
                                  .make_request(method, params), raw_tx)

    def make_batch_request(self, batch_requests: list[tuple[RPCEndpoint, Any]]
                           ) -> list[RPCResponse] | RPCResponse:
        return self._with_retries("batch", lambda: super(ResilientHTTPProvider, self)
                                  .make_batch_request(batch_requests), None)

    def _attempt(self, call: Callable[[], Any]) -> Any:
        self.budget.take()
        try:
            response = call()
        except requests.exceptions.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if status in RETRY_STATUSES:
                raise _Retry(f"HTTP {status}", _retry_after(exc.response)) from exc
            raise RpcUnavailable(f"the RPC endpoint {self.endpoint_uri} answered HTTP "
                                 f"{status}: check the URL and its API key") from exc
        except (requests.exceptions.Timeout, requests.exceptions.ConnectionError,
                ProviderConnectionError, ConnectionError) as exc:
            if _refused(exc):
                raise RpcUnavailable(f"cannot reach the chain at {self.endpoint_uri}: "
                                     f"{DEVNET_HINT}") from exc
            raise _Retry(type(exc).__name__) from exc
        if is_transient(response):
            raise _Retry("rate limited or transient (JSON-RPC)")
        return response

    def _with_retries(self, method: str, call: Callable[[], Any], raw_tx: Any) -> Any:
        s = self.settings
        reason = ""
        for attempt in range(s.retries + 1):
            try:
                response = self._attempt(call)
            except _Retry as exc:
                reason = exc.reason
                if attempt == s.retries:
                    break
                delay = backoff_delay(s, attempt, exc.after)
                log.debug("rpc_retry", method=method, reason=reason, attempt=attempt + 1,
                          delay=round(delay, 3))
                time.sleep(delay)
                continue
            if raw_tx is not None and attempt > 0 and "error" in response:
                # An earlier try may have reached the node before its answer was lost: the
                # resend is then "already known" or "nonce too low". The hash settles it.
                known = self._known_tx(raw_tx)
                if known is not None:
                    return {"jsonrpc": "2.0", "id": response.get("id"), "result": known}
            return response
        raise RpcUnavailable(f"the RPC endpoint {self.endpoint_uri} failed {method} "
                             f"{s.retries + 1} times (last: {reason}): it is throttling or "
                             "down; lower [rpc] rate, raise [rpc] retries or use another "
                             "endpoint")

    def _known_tx(self, raw_tx: Any) -> str | None:
        tx_hash = "0x" + keccak(hexstr=raw_tx if isinstance(raw_tx, str) else
                                Web3.to_hex(raw_tx)).hex()
        try:
            found = self._with_retries("eth_getTransactionByHash", lambda: super(
                ResilientHTTPProvider, self).make_request(
                RPCEndpoint("eth_getTransactionByHash"), [tx_hash]), None)
        except RpcUnavailable:
            return None
        return tx_hash if isinstance(found, dict) and found.get("result") else None


def make_web3(rpc_url: str, timeout: float | None = None,
              settings: RpcSettings | None = None) -> Web3:
    """A Web3 over :class:`ResilientHTTPProvider` (web3's own retries off: they cover
    neither 429 nor -32005 and do not back off with jitter)."""
    s = settings or RpcSettings()
    if timeout is not None:
        s = s.model_copy(update={"timeout": timeout})
    # No default middleware: its chain-id validation costs an extra RPC per call and
    # ENS/gas-strategy layers are useless here (measured 10 ms -> 2 ms per eth_call).
    return Web3(ResilientHTTPProvider(rpc_url, s), middleware=[])


@contextmanager
def rpc_guard(rpc_url: str) -> Iterator[None]:
    """Re-raise transport failures inside the block as :class:`RpcUnavailable`."""
    try:
        yield
    except RpcUnavailable:
        raise  # already says what failed and what to do
    except TRANSPORT_ERRORS as exc:
        raise RpcUnavailable(f"cannot reach the chain at {rpc_url}: {DEVNET_HINT}") from exc


def endpoint_of(w3: Web3) -> str:
    uri: Any = getattr(w3.provider, "endpoint_uri", None)
    return str(uri) if uri else "the configured RPC endpoint"


def check_connected(w3: Web3) -> int:
    """Return the chain id, or raise RpcUnavailable with the fix."""
    with rpc_guard(endpoint_of(w3)):
        return int(w3.eth.chain_id)
