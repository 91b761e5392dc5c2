"""Deadlines on peers that count only the time our own event loop could run.

A transfer deadline blames the peer when it expires. But if our loop was stalled
(a thread holding the GIL, a model built on the loop by mistake, a machine with
more busy processes than cores), every deadline that fell inside the stall expires
at once when the loop comes back, and every provider is banned as "too slow" for
bytes that were waiting in our own socket buffer. A ticker task measures how long
the loop went without running; `run_within` extends a deadline by the stall that
happened inside it (at most `MAX_CREDIT` times the deadline, so it stays bounded).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio
from trio.lowlevel import RunVar, spawn_system_task

T = TypeVar("T")

TICK_S = 0.1
SLACK_S = 0.05  # scheduling jitter that is not a stall
MAX_CREDIT = 10.0  # a deadline grows to at most (1 + MAX_CREDIT) x its length

_WATCH: RunVar[LoopWatch] = RunVar("polnet_loop_watch")


class LoopWatch:
    """Seconds this trio run's loop did not get to run (beyond a tick's jitter)."""

    def __init__(self) -> None:
        self._stalled = 0.0
        self._last = trio.current_time()

    def stalled(self) -> float:
        """Total stall so far, including one still in progress (the ticker may not have
        run yet when a deadline wakes up after the loop comes back)."""
        ongoing = trio.current_time() - self._last - TICK_S - SLACK_S
        return self._stalled + max(0.0, ongoing)

    async def _tick(self) -> None:
        while True:
            await trio.sleep(TICK_S)
            now = trio.current_time()
            self._stalled += max(0.0, now - self._last - TICK_S - SLACK_S)
            self._last = now


def loop_watch() -> LoopWatch:
    """This trio run's watch, its ticker started on first use (a system task: it
    ends with the run and needs no nursery)."""
    try:
        return _WATCH.get()
    except LookupError:
        watch = LoopWatch()
        _WATCH.set(watch)
        spawn_system_task(watch._tick, name="polnet-loop-watch")
        return watch


async def run_within(seconds: float, fn: Callable[[], Awaitable[T]]) -> tuple[T | None, bool]:
    """``(fn's result, False)``, or ``(None, True)`` when `seconds` of our own loop's
    running time passed first (time the loop was stalled is added to the deadline)."""
    watch = loop_watch()
    start, mark = trio.current_time(), watch.stalled()
    out: list[T] = []

    async def guard(scope: trio.CancelScope) -> None:
        credit = 0.0
        while True:
            await trio.sleep_until(start + seconds + credit)
            stalled = min(watch.stalled() - mark, MAX_CREDIT * seconds)
            if stalled <= credit + 1e-3:
                scope.cancel()
                return
            credit = stalled

    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(guard, scope)
                out.append(await fn())
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # fn's own error, as the caller would see it without the guard beside it
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    return (out[0] if out else None), scope.cancelled_caught
