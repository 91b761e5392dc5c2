"""Rate limiting: token buckets for gossip pacing, serving slots, fetch deadlines."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import trio
from pydantic import BaseModel, ConfigDict, Field


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


class ServeLimits(BaseModel):
    """What remote peers may take from us when fetching artifacts.

    Identities are free, so per-peer caps alone cannot protect the serving slots:
    peers we do not know from the on-chain registry ("strangers") share
    `max_streams_total - reserved_for_registered` slots, and when those are full a
    new stream evicts the one that has waited longest for its next request (idle
    at least `evict_idle_s`). Registered nodes may also use the reserved slots.
    `max_streams_per_ip` caps strangers per remote IP; it is off by default
    because a devnet (and every test) runs all peers on 127.0.0.1. Set it on a
    public node: a sybil then needs one IP per few streams.

    A section of the node's settings (``[p2p.serve]``, ``POLNET_P2P__SERVE__*``).
    """

    model_config = ConfigDict(extra="forbid")

    max_streams_per_peer: int = Field(default=8, ge=1)            # registered peers
    max_streams_per_stranger: int = Field(default=4, ge=1)
    max_streams_total: int = Field(default=64, ge=1)
    reserved_for_registered: int = Field(default=16, ge=0)
    max_streams_per_ip: int | None = Field(default=None, ge=1)  # strangers; None: no rule
    bytes_per_second_per_peer: float = Field(default=512 * 1024 * 1024, gt=0)
    idle_timeout_s: float = Field(default=30.0, gt=0)  # a stream with no request: closed
    evict_idle_s: float = Field(default=1.0, ge=0)  # idle this long: may lose its slot
    answer_timeout_s: float = Field(default=20.0, gt=0)  # one answer taken within this


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


class FetchPolicy(BaseModel):
    """How long a provider may take before we give its work to someone else.

    Every request has a deadline: its answer header within `header_timeout_s`,
    then the body at `min_rate_bps` or better (plus `rate_grace_s`). A provider
    that misses one is banned as too slow and its chunks go to other providers.

    A section of the node's settings (``[p2p.fetch]``, ``POLNET_P2P__FETCH__*``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    header_timeout_s: float = Field(default=10.0, gt=0)
    min_rate_bps: float = Field(default=256 * 1024, gt=0)
    rate_grace_s: float = Field(default=2.0, ge=0)
    open_timeout_s: float = Field(default=10.0, gt=0)
    # after the first good manifest, wait this long for others
    manifest_grace_s: float = Field(default=0.3, ge=0)

    def body_deadline(self, size: int) -> float:
        return self.rate_grace_s + size / self.min_rate_bps


DEFAULT_POLICY = FetchPolicy()
