"""Who may announce what, and when: the policy over verified announcements.

A valid signature only proves who sent an announcement. Before anything acts on
one it must also be

- fresh: its `ts_ms` within a window around our clock, and not a repeat of one
  already seen (same sender, `seq` and `ts_ms`): gossip re-delivers, attackers
  replay (:class:`ReplayGuard`);
- from the party entitled to make it: statements about a job's trace
  (`result_committed`, `state_served`) only from the job's current solver, as
  the chain says (:class:`EntitledSenders`); a collaborative job's outer state
  (`outer_state`) from any staked node (every follower recomputes it, and a
  receiver checks it against the accepted hash). Senders that are not staked
  nodes (free + locked stake below the minimum verifier or solver stake, as the
  caller's `registered()` set says; a registration alone costs only gas) are
  dropped before any chain lookup (reason "not_registered"), so strangers and
  gas-only registrations cost nothing.

All state here is bounded (LRU), whatever strangers send.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from node.p2p.announce import Announcement

# Announcements that speak for a job's solver; their payloads carry `job_id`.
SOLVER_KINDS = frozenset({"result_committed", "state_served"})
# Announcements any staked node may make: slashable stake stands behind each sender
# because `registered()` lists only nodes holding the minimum stake, not every
# registration (registering costs gas only).
REGISTERED_KINDS = frozenset({"outer_state"})

Resolver = Callable[[int], Awaitable[str | None]]  # job id -> its solver's peer id, or None


class ReplayGuard:
    """Drops announcements outside [now - window, now + skew] and repeats within it."""

    def __init__(self, window_s: float = 300.0, skew_s: float = 30.0,
                 max_senders: int = 4096, per_sender: int = 512) -> None:
        self.window_ms = int(window_s * 1000)
        self.skew_ms = int(skew_s * 1000)
        self.max_senders = max_senders
        self.per_sender = per_sender
        # sender -> {(seq, ts_ms): None}, oldest first; senders LRU
        self._seen: OrderedDict[str, OrderedDict[tuple[int, int], None]] = OrderedDict()

    def fresh(self, ann: Announcement, now_ms: int | None = None) -> str:
        """"" if `ann` is within the time window, else the drop reason (stateless)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if ann.ts_ms < now - self.window_ms:
            return "stale"
        if ann.ts_ms > now + self.skew_ms:
            return "future"
        return ""

    def check(self, ann: Announcement, now_ms: int | None = None) -> str:
        """"" and remembered if fresh and new, else the drop reason."""
        reason = self.fresh(ann, now_ms)
        if reason:
            return reason
        seen = self._seen.get(ann.sender)
        if seen is None:
            seen = self._seen[ann.sender] = OrderedDict()
            while len(self._seen) > self.max_senders:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(ann.sender)
        key = (ann.seq, ann.ts_ms)
        if key in seen:
            return "replayed"
        seen[key] = None
        while len(seen) > self.per_sender:
            seen.popitem(last=False)
        return ""

    def __len__(self) -> int:
        return sum(len(s) for s in self._seen.values())

    @property
    def senders(self) -> int:
        return len(self._seen)


class EntitledSenders:
    """Checks that job announcements come from the job's solver.

    `resolve(job_id)` asks the chain for the solver's peer id (cached for
    `ttl_s`, a reopened job gets a new solver); `registered()` returns the peer
    ids of registered nodes holding slashable stake, which a solver always is.
    """

    def __init__(self, resolve: Resolver, registered: Callable[[], set[str]] | None = None,
                 ttl_s: float = 10.0, max_jobs: int = 4096) -> None:
        self.resolve = resolve
        self.registered = registered
        self.ttl_s = ttl_s
        self.max_jobs = max_jobs
        self._cache: OrderedDict[int, tuple[str | None, float]] = OrderedDict()
        self.lookups = 0

    async def solver_of(self, job_id: int) -> str | None:
        hit = self._cache.get(job_id)
        now = time.monotonic()
        if hit is not None and now - hit[1] < self.ttl_s:
            self._cache.move_to_end(job_id)
            return hit[0]
        self.lookups += 1
        peer = await self.resolve(job_id)
        self._cache[job_id] = (peer, now)
        self._cache.move_to_end(job_id)
        while len(self._cache) > self.max_jobs:
            self._cache.popitem(last=False)
        return peer

    async def check(self, ann: Announcement) -> str:
        """"" if `ann`'s sender may say it, else the drop reason."""
        if ann.kind not in SOLVER_KINDS | REGISTERED_KINDS:
            return ""
        if self.registered is not None and ann.sender not in self.registered():
            return "not_registered"
        if ann.kind in REGISTERED_KINDS:
            return ""
        job_id = ann.payload.get("job_id")
        if type(job_id) is not int:
            return "bad_payload"
        try:
            solver = await self.solver_of(job_id)
        except Exception:  # the chain is unreachable: the solver announces again
            return "unresolved"
        if solver is None:
            return "unknown_job"
        return "" if solver == ann.sender else "not_entitled"
