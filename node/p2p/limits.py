"""Rate limiting: token buckets for gossip pacing, serving slots, fetch deadlines."""

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
    """What remote peers may take from us when fetching artifacts.

    Identities are free, so per-peer caps alone cannot protect the serving slots:
    peers we do not know from the on-chain registry ("strangers") share
    `max_streams_total - reserved_for_registered` slots, and when those are full a
    new stream evicts the one that has waited longest for its next request (idle
    at least `evict_idle_s`). Registered nodes may also use the reserved slots.
    `max_streams_per_ip` caps strangers per remote IP; it is off by default
    because a devnet (and every test) runs all peers on 127.0.0.1. Set it on a
    public node: a sybil then needs one IP per few streams.
    """

    max_streams_per_peer: int = 8            # registered peers
    max_streams_per_stranger: int = 4
    max_streams_total: int = 64
    reserved_for_registered: int = 16
    max_streams_per_ip: int | None = None    # strangers; None = no per-IP rule
    bytes_per_second_per_peer: float = 512 * 1024 * 1024
    idle_timeout_s: float = 30.0             # a stream without a request is closed
    evict_idle_s: float = 1.0                # idle this long: may give its slot away
    answer_timeout_s: float = 20.0           # one answer must be taken within this


@dataclass(eq=False)
class Slot:
    """One served stream's claim on the serving capacity."""

    peer: str
    ip: str | None
    registered: bool
    idle_since: float | None = None          # None while a request is being answered
    released: bool = False
    cancel: trio.CancelScope | None = None   # cancelled to evict the stream


@dataclass
class PeerAllowance:
    limits: ServeLimits
    streams: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    total: int = 0
    registered: set[str] = field(default_factory=set)   # peer ids (base58) from the registry
    slots: set[Slot] = field(default_factory=set)
    evicted: int = 0
    refused: int = 0

    def _strangers(self) -> list[Slot]:
        return [s for s in self.slots if not s.registered]

    def _room(self, peer: str, ip: str | None, registered: bool) -> bool:
        lim = self.limits
        if registered:
            return (self.streams.get(peer, 0) < lim.max_streams_per_peer
                    and self.total < lim.max_streams_total)
        strangers = self._strangers()
        if self.streams.get(peer, 0) >= lim.max_streams_per_stranger:
            return False
        if lim.max_streams_per_ip is not None and ip is not None \
                and sum(1 for s in strangers if s.ip == ip) >= lim.max_streams_per_ip:
            return False
        pool = max(0, lim.max_streams_total - lim.reserved_for_registered)
        return len(strangers) < pool and self.total < lim.max_streams_total

    def _evictable(self, registered: bool) -> Slot | None:
        """The longest-idle stream whose slot a newcomer may take."""
        now = trio.current_time()
        idle = [s for s in self.slots if s.idle_since is not None
                and now - s.idle_since >= self.limits.evict_idle_s
                and (registered or not s.registered)]
        # Strangers' streams go first, the longest idle first.
        return min(idle, key=lambda s: (s.registered, s.idle_since or 0.0), default=None)

    def claim(self, peer: str, ip: str | None = None) -> Slot | None:
        """A slot for a new stream from `peer`, evicting an idle stream if need be."""
        registered = peer in self.registered
        if not self._room(peer, ip, registered):
            over_peer = self.streams.get(peer, 0) >= (
                self.limits.max_streams_per_peer if registered
                else self.limits.max_streams_per_stranger)
            victim = None if over_peer else self._evictable(registered)
            if victim is None:
                self.refused += 1
                return None
            self._free(victim)
            if victim.cancel is not None:
                victim.cancel.cancel()
            self.evicted += 1
            if not self._room(peer, ip, registered):  # e.g. the per-IP rule
                self.refused += 1
                return None
        slot = Slot(peer, ip, registered, idle_since=trio.current_time())
        self.slots.add(slot)
        self.streams[peer] += 1
        self.total += 1
        return slot

    def _free(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        self.slots.discard(slot)
        self.streams[slot.peer] -= 1
        self.total -= 1
        if self.streams[slot.peer] <= 0:
            del self.streams[slot.peer]

    def release(self, slot: Slot) -> None:
        self._free(slot)

    def bucket(self, peer: str) -> TokenBucket:
        if peer not in self.buckets:
            if len(self.buckets) >= 4096:  # bounded: forget the oldest idle peers
                for key in list(self.buckets)[:1024]:
                    if key not in self.streams:
                        del self.buckets[key]
            rate = self.limits.bytes_per_second_per_peer
            self.buckets[peer] = TokenBucket(rate, burst=max(rate / 4, 256 * 1024))
        return self.buckets[peer]


@dataclass(frozen=True)
class FetchPolicy:
    """How long a provider may take before we give its work to someone else.

    Every request has a deadline: its answer header within `header_timeout_s`,
    then the body at `min_rate_bps` or better (plus `rate_grace_s`). A provider
    that misses one is banned as too slow and its chunks go to other providers.
    """

    header_timeout_s: float = 10.0
    min_rate_bps: float = 256 * 1024
    rate_grace_s: float = 2.0
    open_timeout_s: float = 10.0
    manifest_grace_s: float = 0.3   # after the first good manifest, wait this for others

    def body_deadline(self, size: int) -> float:
        return self.rate_grace_s + size / self.min_rate_bps


DEFAULT_POLICY = FetchPolicy()
