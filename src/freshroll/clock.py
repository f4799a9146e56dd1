"""Time sources: a real clock, and a virtual clock that jumps when everything waits.

The kernel never calls ``time`` directly: it asks a :class:`Clock`. With
:class:`RealClock` timestamps are wall-clock seconds. With
:class:`VirtualClock`, :meth:`VirtualClock.run` drives a coroutine on an
asyncio loop whose time is virtual: whenever no callback is ready and nothing
arrived on the loop's sockets, the clock jumps straight to the next timer
(like trio's ``MockClock(autojump_threshold=0)``). ``asyncio.sleep``,
``asyncio.timeout`` and ``wait_for`` all follow it, so an hour of simulated
cluster time or a 30 s timeout test takes milliseconds, deterministically.

Blocking work handed to threads still takes real time; code meant to run in
virtual time awaits ``asyncio.sleep`` instead (e.g. the simulated engine).
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds; only differences and order matter."""
        ...


class RealClock:
    """Wall-clock seconds since the epoch (``time.time``)."""

    def now(self) -> float:
        return time.time()


class VirtualClock:
    """A clock that only moves when told to, or when its event loop is idle."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot advance a clock by {seconds} s")
        self._now += seconds

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        """An asyncio loop whose ``time()`` is this clock and that auto-jumps when idle."""
        return _VirtualLoop(self)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to completion in virtual time."""
        loop = self.new_event_loop()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


class _JumpingSelector(selectors.DefaultSelector):
    """Polls instead of sleeping; a wait with a timeout becomes a clock jump."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing scheduled: only another thread can wake us
            return super().select(None)
        self._clock.advance(timeout)
        return []


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_JumpingSelector(clock))
        self._virtual_clock = clock
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual_clock.now()
