"""The waits in flight, and the two rules that read them: the heartbeat and the no-progress guard.

Every stage that awaits something that may never come back registers it here for as long as
it waits (:meth:`Waits.waiting`): *what* it awaits, in the words the operator sees
(``w0 generate``, ``w0 load weights``, ``w0 start``, ``reward function 'f'``, ``trainer
step 3``), since when (the run's clock) and the bound that ends the wait (the ``limits``
key in force). A wait always has a bound: this module only says what is being waited on;
the timeout itself stays with the stage (``asyncio.timeout``, a thread's deadline).

Rules (``now`` and every ``since`` from the same clock; ``h = limits.heartbeat_s``,
``m = limits.max_no_progress_s``)::

    overdue(now)  = the oldest wait of each `what` with  now - since >= h,  oldest first
    due(now)      = overdue(now), each `what` at most once per h (the heartbeat lines)
    line(w, now)  = "waiting {now - since} s on {what}, limit {limit:g} s"  (whole seconds;
                                                            tenths below 10 s)
    stalled(now)  = now - last_progress >= m     (last_progress: the last committed or
                                                  skipped step, else the moment the first
                                                  workers were up: a start has its own bound)

A stalled run stops (:class:`~freshroll.errors.NoProgress`, :func:`stall_message`) naming
the oldest wait in flight, or saying that nothing was in flight (every stage idle: the
trainer waited for data that no stage was producing).

Pure: no I/O, no asyncio; time is passed in. Registration is O(1); a query is linear in the
waits in flight (a handful per worker).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from freshroll.clock import Clock


@dataclass(frozen=True)
class Wait:
    """One wait in flight: what is awaited, since when, and the bound that ends it."""

    what: str
    since: float
    limit_s: float | None = None  # None: bounded elsewhere (named in `what`)

    def line(self, now: float) -> str:
        """``waiting 60 s on w0 generate, limit 600 s``."""
        limit = f", limit {self.limit_s:g} s" if self.limit_s is not None else ""
        return f"waiting {seconds(now - self.since)} s on {self.what}{limit}"


class Waits:
    """The waits in flight of one run (module docstring)."""

    def __init__(self, clock: Clock, heartbeat_s: float) -> None:
        self.clock, self.heartbeat_s = clock, heartbeat_s
        self._waits: dict[int, Wait] = {}
        self._open: Counter[str] = Counter()  # waits in flight per ``what`` (O(1) end)
        self._ids = itertools.count()
        self._said: dict[str, float] = {}  # what -> when its last heartbeat line was due
        self.last_progress: float | None = None  # None: not counting yet (workers starting)

    def begin(self, what: str, limit_s: float | None = None) -> int:
        """Register a wait starting now; returns its token for :meth:`end`."""
        token = next(self._ids)
        self._waits[token] = Wait(what, self.clock.now(), limit_s)
        self._open[what] += 1
        return token

    def end(self, token: int) -> None:
        """The wait is over (returned, failed, timed out or cancelled)."""
        wait = self._waits.pop(token, None)
        if wait is None:
            return
        self._open[wait.what] -= 1
        if self._open[wait.what] <= 0:  # the last wait on it: its heartbeat starts over
            del self._open[wait.what]
            self._said.pop(wait.what, None)

    @contextmanager
    def waiting(self, what: str, limit_s: float | None = None) -> Iterator[None]:
        """``with waits.waiting("w0 generate", 600): await ...``."""
        token = self.begin(what, limit_s)
        try:
            yield
        finally:
            self.end(token)

    def progressed(self, now: float | None = None) -> None:
        """A step was committed (or skipped), or the first workers are up: the no-progress
        clock starts (again)."""
        self.last_progress = self.clock.now() if now is None else now

    def overdue(self, now: float) -> list[Wait]:
        """The oldest wait of each ``what`` waiting at least ``heartbeat_s``, oldest first."""
        oldest: dict[str, Wait] = {}
        for w in self._waits.values():
            if now - w.since >= self.heartbeat_s and (
                    w.what not in oldest or w.since < oldest[w.what].since):
                oldest[w.what] = w
        return sorted(oldest.values(), key=lambda w: w.since)

    def due(self, now: float) -> list[Wait]:
        """The overdue waits whose heartbeat line is due now (each at most once per
        ``heartbeat_s``); marks them said."""
        out = []
        for w in self.overdue(now):
            last = self._said.get(w.what)
            if last is None or now - last >= self.heartbeat_s:
                self._said[w.what] = now
                out.append(w)
        return out

    def oldest(self) -> Wait | None:
        """The wait in flight the longest, or None."""
        return min(self._waits.values(), key=lambda w: w.since, default=None)

    def stalled(self, now: float, max_no_progress_s: float) -> bool:
        return self.last_progress is not None and now - self.last_progress >= max_no_progress_s


def seconds(s: float) -> str:
    """``60``, ``1800``; tenths below 10 s (``0.4``): a short bound's wait reads as moving."""
    s = max(0.0, s)
    return f"{s:.0f}" if s >= 10 else f"{s:.1f}"


def heartbeat(waits: list[Wait], now: float) -> str:
    """One line for the due waits: ``waiting 60 s on w0 generate, limit 600 s; ...``."""
    return "; ".join(w.line(now) for w in waits)


def stall_message(waits: Waits, now: float, max_no_progress_s: float, step: int) -> str:
    """Why a stalled run stops: how long, the limit, and what it was waiting on."""
    since = waits.last_progress if waits.last_progress is not None else now
    head = (f"no trainer step committed for {seconds(now - since)} s "
            f"(limits.max_no_progress_s={max_no_progress_s:g}) after step {step}")
    w = waits.oldest()
    if w is None:
        return f"{head}; nothing was in flight (every stage idle)"
    return f"{head}; {w.line(now)}"


__all__ = ["Wait", "Waits", "heartbeat", "seconds", "stall_message"]
