"""One loop timer for every simulated engine of a loop (:mod:`freshroll.sim.engine`).

An engine schedules its next wakeup here; one ``loop.call_at`` timer serves the heap of all
of them, so on a :class:`~freshroll.clock.VirtualClock` the loop jumps to the next wakeup as to
an ``asyncio.sleep`` and an event costs a callback, not a task switch. An engine is any object
with ``_wake_seq`` (its live entry) and ``_on_timer(when)``.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import weakref
from typing import Any


class Wakeups:
    """One loop timer for every simulated engine of a loop: a heap of ``(loop time, seq,
    engine)``. An entry is live while the engine's ``_wake_seq`` is its seq (re-arming
    pushes a new entry, the old one is skipped when it comes up)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._firing = False

    def schedule(self, engine: Any, when: float) -> int:
        """Wake ``engine`` at loop time ``when``; the entry's seq."""
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, engine))
        if when < self._timer_at and not self._firing:
            self._arm(when)
        return self._seq

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        heap = self._heap
        limit = max(self._timer_at, self._loop.time())  # the loop may fire a hair early
        self._timer, self._timer_at = None, math.inf
        self._firing = True  # wakeups set meanwhile only join the heap
        try:
            while heap and heap[0][0] <= limit:
                when, seq, engine = heapq.heappop(heap)
                if engine._wake_seq == seq:
                    engine._on_timer(when)
        finally:
            self._firing = False
            while heap and heap[0][2]._wake_seq != heap[0][1]:  # drop dead entries on top
                heapq.heappop(heap)
            if heap:
                self._arm(heap[0][0])


_WAKEUPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Wakeups] = (
    weakref.WeakKeyDictionary()
)


def wakeups(loop: asyncio.AbstractEventLoop) -> Wakeups:
    w = _WAKEUPS.get(loop)
    if w is None:
        w = _WAKEUPS[loop] = Wakeups(loop)
    return w


__all__ = ["Wakeups", "wakeups"]
