"""Rate limiting: token buckets for gossip pacing and per-peer serving limits."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import trio


class TokenBucket:
    """`rate` tokens per second, at most `burst` banked. `take` waits, never drops."""

    def __init__(self, rate: float, burst: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._stamp = trio.current_time() if _in_trio() else 0.0
        self._lock = trio.Lock()

    def _refill(self) -> None:
        now = trio.current_time()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def try_take(self, n: float = 1.0) -> bool:
        self._refill()
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False

    async def take(self, n: float = 1.0) -> None:
        """Wait until `n` tokens are available (n may exceed `burst`: paid in parts)."""
        async with self._lock:  # FIFO: one waiter at a time keeps pacing fair
            while n > 0:
                part = min(n, self.burst)
                self._refill()
                if self._tokens < part:
                    await trio.sleep((part - self._tokens) / self.rate)
                    self._refill()
                self._tokens -= part
                n -= part


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


@dataclass
class ServeLimits:
    """What one remote peer may take from us when fetching artifacts."""

    max_streams_per_peer: int = 8
    bytes_per_second_per_peer: float = 512 * 1024 * 1024
    max_streams_total: int = 64
    idle_timeout_s: float = 30.0


@dataclass
class PeerAllowance:
    limits: ServeLimits
    streams: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    total: int = 0

    def acquire(self, peer: str) -> bool:
        if (self.streams[peer] >= self.limits.max_streams_per_peer
                or self.total >= self.limits.max_streams_total):
            return False
        self.streams[peer] += 1
        self.total += 1
        return True

    def release(self, peer: str) -> None:
        self.streams[peer] -= 1
        self.total -= 1
        if self.streams[peer] <= 0:
            del self.streams[peer]

    def bucket(self, peer: str) -> TokenBucket:
        if peer not in self.buckets:
            rate = self.limits.bytes_per_second_per_peer
            self.buckets[peer] = TokenBucket(rate, burst=max(rate / 4, 256 * 1024))
        return self.buckets[peer]
