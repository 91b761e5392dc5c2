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

    def tokens(self) -> float:
        self._refill()
        return self._tokens

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

    Identities are free, so per-peer caps alone cannot protect the serving slots.
    Three tiers of peers, told to us by the chain the node follows:

    - *seats*: the committee and jurors of a job whose dispute is live (and its
      parties): they may use every slot;
    - *staked*: nodes with slashable stake (free + locked >= the minimum verifier
      or solver stake): `max_streams_total - reserved_for_seats` slots;
    - *strangers* (everyone else, a gas-only registration included): share
      `max_streams_total - reserved_for_registered` slots, at most
      `max_streams_per_stranger` each.

    Holding a slot costs consumption, not just presence. A request that pulls no
    real bytes (a manifest, a refused request, a read of less than
    `productive_bytes`) is *cheap*: after `cheap_per_stream` cheap requests in a row,
    on the stream or by its peer over all its streams (a fresh stream inherits its
    peer's record), a stream may lose its slot to a newcomer of its tier or above
    at once (as may one idle `evict_idle_s`; one that keeps pulling chunks never does),
    after `max_cheap_per_stream` it is closed, and each peer has a budget of
    `cheap_per_s_per_peer` (burst `cheap_burst_per_peer`) over all its streams: a
    peer out of budget has the stream closed and new streams refused until it
    refills. An honest fetch asks one manifest per stream and then reads whole
    chunks (>= 1 MiB), so it never comes near these. `max_streams_per_ip` caps
    strangers per remote IP; it is off by default because a devnet (and every
    test) runs all peers on 127.0.0.1. Set it on a public node.

    A section of the node's settings (``[p2p.serve]``, ``POLNET_P2P__SERVE__*``).
    """

    model_config = ConfigDict(extra="forbid")

    max_streams_per_peer: int = Field(default=8, ge=1)            # staked peers and seats
    max_streams_per_stranger: int = Field(default=4, ge=1)
    max_streams_total: int = Field(default=64, ge=1)
    reserved_for_registered: int = Field(default=16, ge=0)  # kept from strangers
    reserved_for_seats: int = Field(default=4, ge=0)        # kept from all but seats
    max_streams_per_ip: int | None = Field(default=None, ge=1)  # strangers; None: no rule
    bytes_per_second_per_peer: float = Field(default=512 * 1024 * 1024, gt=0)
    idle_timeout_s: float = Field(default=30.0, gt=0)  # a stream with no request: closed
    evict_idle_s: float = Field(default=1.0, ge=0)  # idle this long: may lose its slot
    answer_timeout_s: float = Field(default=20.0, gt=0)  # one answer taken within this
    productive_bytes: int = Field(default=256 * 1024, ge=1)  # a read this big is not cheap
    cheap_per_stream: int = Field(default=3, ge=1)  # this many cheap in a row: evictable
    max_cheap_per_stream: int = Field(default=8, ge=1)  # then the stream is closed
    # Generous: a verifier fetches dozens of small artifacts (specs, tiny checkpoints:
    # two cheap requests each) from one solver in a burst. The per-stream rule above
    # is what frees slots; this stops one id from churning streams without end.
    cheap_per_s_per_peer: float = Field(default=16.0, gt=0)
    cheap_burst_per_peer: float = Field(default=128.0, ge=1)


STRANGER, STAKED, SEAT = 0, 1, 2  # tiers: a newcomer evicts only from its tier or below


@dataclass(eq=False)
class Slot:
    """One served stream's claim on the serving capacity."""

    peer: str
    ip: str | None
    tier: int
    idle_since: float | None = None          # None while a request is being answered
    released: bool = False
    cancel: trio.CancelScope | None = None   # cancelled to evict the stream
    cheap: int = 0                           # cheap requests since real bytes were pulled

    @property
    def registered(self) -> bool:
        """Staked or seated: served from the reserved slots."""
        return self.tier > STRANGER


@dataclass
class PeerAllowance:
    limits: ServeLimits
    streams: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    cheap_buckets: dict[str, TokenBucket] = field(default_factory=dict)
    streaks: dict[str, int] = field(default_factory=dict)  # peer -> cheap in a row
    total: int = 0
    staked: set[str] = field(default_factory=set)   # peer ids (base58) with slashable stake
    seats: set[str] = field(default_factory=set)    # on a live dispute's committee or jury
    slots: set[Slot] = field(default_factory=set)
    evicted: int = 0
    refused: int = 0
    cut: int = 0        # streams closed for asking without consuming

    def tier(self, peer: str) -> int:
        return SEAT if peer in self.seats else STAKED if peer in self.staked else STRANGER

    def _room(self, peer: str, ip: str | None, tier: int) -> bool:
        lim = self.limits
        n = self.streams.get(peer, 0)
        if tier == SEAT:
            return n < lim.max_streams_per_peer and self.total < lim.max_streams_total
        if tier == STAKED:
            pool = max(0, lim.max_streams_total - lim.reserved_for_seats)
            return n < lim.max_streams_per_peer and self.total < pool
        strangers = [s for s in self.slots if s.tier == STRANGER]
        if n >= lim.max_streams_per_stranger:
            return False
        if lim.max_streams_per_ip is not None and ip is not None \
                and sum(1 for s in strangers if s.ip == ip) >= lim.max_streams_per_ip:
            return False
        pool = max(0, lim.max_streams_total - lim.reserved_for_registered)
        return len(strangers) < pool and self.total < lim.max_streams_total

    def wasteful(self, slot: Slot) -> bool:
        """The stream, or its peer over all its streams (so a fresh stream inherits
        its peer's record), asked `cheap_per_stream` times in a row without pulling
        real bytes."""
        n = self.limits.cheap_per_stream
        return slot.cheap >= n or self.streaks.get(slot.peer, 0) >= n

    def _evictable(self, tier: int) -> Slot | None:
        """The stream whose slot a newcomer of `tier` may take, if any: a wasteful one
        (even mid-answer) or one idle `evict_idle_s`; lower tiers first, then the
        wasteful, then the longest idle."""
        now = trio.current_time()

        def idle(s: Slot) -> bool:
            return s.idle_since is not None and now - s.idle_since >= self.limits.evict_idle_s

        cands = [s for s in self.slots if s.tier <= tier and (self.wasteful(s) or idle(s))]
        return min(cands, key=lambda s: (s.tier, not self.wasteful(s),
                                         -max(s.cheap, self.streaks.get(s.peer, 0)),
                                         s.idle_since if s.idle_since is not None else now),
                   default=None)

    def claim(self, peer: str, ip: str | None = None) -> Slot | None:
        """A slot for a new stream from `peer`, evicting a stream if need be; None
        when there is no room or the peer has spent its budget of cheap requests."""
        tier = self.tier(peer)
        if self.cheap_bucket(peer).tokens() < 1:
            self.refused += 1
            return None
        if not self._room(peer, ip, tier):
            cap = self.limits.max_streams_per_peer if tier else self.limits.max_streams_per_stranger
            victim = None if self.streams.get(peer, 0) >= cap else self._evictable(tier)
            if victim is not None:
                self.evict(victim)
            if victim is None or not self._room(peer, ip, tier):  # e.g. the per-IP rule
                self.refused += 1
                return None
        slot = Slot(peer, ip, tier, idle_since=trio.current_time())
        self.slots.add(slot)
        self.streams[peer] += 1
        self.total += 1
        return slot

    def evict(self, slot: Slot) -> None:
        self._free(slot)
        if slot.cancel is not None:
            slot.cancel.cancel()
        self.evicted += 1

    def charge(self, slot: Slot, pulled: int) -> bool:
        """Account one answered request that moved `pulled` body bytes; False when the
        stream must be closed (its own or its peer's budget of cheap requests spent)."""
        if pulled >= self.limits.productive_bytes:
            slot.cheap = 0
            self.streaks.pop(slot.peer, None)
            return True
        slot.cheap += 1
        self.streaks[slot.peer] = self.streaks.pop(slot.peer, 0) + 1  # newest last
        if len(self.streaks) > 4096:  # bounded: forget the oldest
            for key in list(self.streaks)[:1024]:
                del self.streaks[key]
        if not self.cheap_bucket(slot.peer).try_take(1.0) \
                or slot.cheap >= self.limits.max_cheap_per_stream:
            self.cut += 1
            return False
        return True

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
            rate = self.limits.bytes_per_second_per_peer
            self.buckets[peer] = TokenBucket(rate, burst=max(rate / 4, 256 * 1024))
            self._bound(self.buckets)
        return self.buckets[peer]

    def cheap_bucket(self, peer: str) -> TokenBucket:
        if peer not in self.cheap_buckets:
            lim = self.limits
            self.cheap_buckets[peer] = TokenBucket(lim.cheap_per_s_per_peer,
                                                   lim.cheap_burst_per_peer)
            self._bound(self.cheap_buckets)
        return self.cheap_buckets[peer]

    def _bound(self, buckets: dict[str, TokenBucket]) -> None:
        """At most 4096 peers remembered: forget the oldest without a stream. A
        forgotten peer starts again with a full budget, so only streams it holds
        keep its debt; new ids are free anyway."""
        if len(buckets) > 4096:
            for key in list(buckets)[:1024]:
                if key not in self.streams:
                    del buckets[key]


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
