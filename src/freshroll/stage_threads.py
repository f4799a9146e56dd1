"""How many intra-op threads a stage's calls get, settled on the run's own calls.

A thread probe before the clock starts (:mod:`freshroll.placement.thread_probe`) times a
fragment of a step on a copy of the model, and a fragment can misjudge the whole batch (a
9M-parameter model's, issue 25: docs/overlap.md, "A sync run settles each stage on its own
calls"). A sync run needs no guess: its steps repeat the same work, so each
stage (``generate`` on the worker's thread, ``train`` on the trainer's) measures both
counts on its own calls and keeps the faster. Pure policy: no torch, no clock; the caller
times each call and sets the count.

The schedule, per stage, with ``n`` the cores this process may use::

    calls 1 .. warmup                   n threads, not timed (first calls warm the allocator)
    the next 2 x trials calls           1, n, 1, n, ...  each timed, in seconds per row
    then                                n  if  median(n) x MARGIN <= median(1)  else  1
    early, after any pair               n  if  median(n) x DECISIVE <= median(1)
                                        1  if  max(1) x DECISIVE_LOSS <= min(n)

A tie goes to one thread: it leaves a core to the rest of the run (rewards, the ledger) and
to other processes. ``trials`` >= 2 each; the median of each set absorbs one outlier (a
step that met a garbage collection or a burst of another process). The early rule cuts the
trials' cost where threads clearly pay (at a 5M-parameter model each trial at one thread
costs most of a step, and a 20-step run paid three per stage).
It settles on one thread early only when every call on ``n`` lost to every call on one by far
more than an outlier would (:data:`DECISIVE_LOSS`, 3x): where another process holds a core,
an OpenMP team of ``n`` waits on its descheduled thread at every barrier, a call on two
threads then takes several times one thread's (docs/overlap.md, "A sync run settles each
stage on its own calls"), and each further trial at ``n`` costs several steps.

The trials cost most in short runs of large models (each trial at one thread is a step's
stage at one thread, slower by what the second core gains). A run of the same work as an
earlier one, at the same load, starts settled on that run's choice
(:meth:`StageThreads.reuse`, fed by :mod:`freshroll.placement.probe_cache`; ``reused_from``
says when it was measured).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

#: many threads are kept when their median call is at least this much faster than one's
MARGIN = 1.05
#: ... and kept at once, before every trial ran, when at least this much faster
DECISIVE = 1.25
#: one thread is kept at once, before every trial ran, when many threads are this much slower
DECISIVE_LOSS = 3.0


@dataclass
class StageThreads:
    """One stage's thread count: trials on its first calls, then the faster (module doc).

    Thread-safe: several workers' threads may share a stage's choice."""

    stage: str
    many: int
    warmup: int = 1
    trials: int = 3
    calls: int = 0  # calls handed a count so far
    timed: dict[int, list[float]] = field(default_factory=lambda: {1: []})
    settled: int | None = None
    #: when the settled count was measured, if an earlier run's was reused (unix time; 0: by
    #: this run's own calls): freshroll.placement.probe_cache
    reused_from: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.many < 2:
            raise ValueError(f"{self.stage}: nothing to choose with {self.many} thread(s)")
        if self.trials < 2 or self.warmup < 0:
            raise ValueError(f"{self.stage}: trials >= 2 and warmup >= 0, got "
                             f"{self.trials} and {self.warmup}")
        self.timed.setdefault(self.many, [])

    def take(self) -> tuple[int, bool]:
        """The thread count of the next call, and whether to time it (:meth:`record`)."""
        with self._lock:
            k, self.calls = self.calls, self.calls + 1
            if self.settled is not None:
                return self.settled, False
            if k < self.warmup:
                return self.many, False
            trial = k - self.warmup
            if trial >= 2 * self.trials:  # records still out (several workers): many
                return self.many, False
            return (1 if trial % 2 == 0 else self.many), True

    def record(self, threads: int, seconds: float, rows: int) -> None:
        """A timed call's seconds for ``rows`` rows at ``threads`` threads; settles the stage
        once every trial is in."""
        with self._lock:
            if self.settled is not None or threads not in self.timed or rows < 1:
                return
            self.timed[threads].append(seconds / rows)
            if any(not v for v in self.timed.values()):
                return
            one = statistics.median(self.timed[1])
            many = statistics.median(self.timed[self.many])
            paired = len(self.timed[1]) == len(self.timed[self.many])
            if many * DECISIVE <= one and paired:
                self.settled = self.many  # early: threads clearly pay (module doc)
            elif max(self.timed[1]) * DECISIVE_LOSS <= min(self.timed[self.many]) and paired:
                self.settled = 1  # early: every many call lost far beyond an outlier (doc)
            elif all(len(v) >= self.trials for v in self.timed.values()):
                self.settled = self.many if many * MARGIN <= one else 1

    def reuse(self, settled: int, timed: dict[int, list[float]], measured_at: float) -> bool:
        """Start settled on an earlier run's choice for the same work (its timed calls kept
        for the figures); False, unchanged, when it does not fit this stage (another
        ``many``, a count that is neither 1 nor ``many``, no timings of either)."""
        if (settled not in (1, self.many) or set(timed) != {1, self.many}
                or not all(timed.values())):
            return False
        with self._lock:
            if self.calls or self.settled is not None:
                return False  # already taking its own calls: those stand
            self.settled, self.reused_from = settled, measured_at
            self.timed = {k: list(v) for k, v in timed.items()}
        return True

    def gain(self) -> float | None:
        """How much faster a call ran on ``many`` threads than on one (None until settled)."""
        if self.settled is None:
            return None
        many = statistics.median(self.timed[self.many])
        return statistics.median(self.timed[1]) / many if many > 0 else None

    def describe(self) -> str:
        if self.settled is None:
            return f"{self.stage}: not settled ({self.calls} call(s))"
        reused = (f"; reused, measured "
                  f"{time.strftime('%H:%M:%S', time.localtime(self.reused_from))}"
                  if self.reused_from else "")
        return (f"{self.stage} {self.settled} thread(s) ({self.gain():.2f}x on {self.many}, "
                f"needs {MARGIN:.2f}x{reused})")

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "many": self.many, "settled": self.settled,
                "gain": self.gain(), "calls": self.calls, "reused_from": self.reused_from,
                "seconds_per_row": {str(k): v for k, v in self.timed.items()}}


class ThreadCounts(Protocol):
    """What a stage's calls ask for their thread count
    (:func:`~freshroll.placement.adapters.tuned`): :class:`StageThreads` or
    :class:`ModeThreads`."""

    def take(self) -> tuple[int, bool]: ...

    def record(self, threads: int, seconds: float, rows: int) -> None: ...


class ModeThreads:
    """An async run's stage in worker processes: its thread count by the sync fallback's mode.

    An async ``process`` run gives the trainer and each worker process a share of the cores
    (one each on two cores), since their calls overlap. In the fallback's sync windows the
    stages take turns, as a sync run's do, so there each stage settles 1 or all the cores on
    its own calls (``sync``, a :class:`StageThreads`): the window then measures the sync run a
    user would otherwise run, not a sync run on a core's share, and the fallback keeps async
    only where it beats that (issue 25: against a window on a core's share, an async run at a
    1M-parameter model kept async and was slower than the sync run: docs/overlap.md)::

        async windows    shared            (the placement's budget per process), untimed
        sync windows     sync.take()       trials, then the settled count (module doc)

    A call taken in one mode and finished in the other is not recorded."""

    def __init__(self, shared: int, sync: StageThreads) -> None:
        if not 1 <= shared <= sync.many:
            raise ValueError(f"{sync.stage}: shared {shared} threads, need 1 <= shared <= "
                             f"{sync.many}")
        self.shared, self.sync, self.mode = shared, sync, "async"
        self.stage = sync.stage

    def set_mode(self, mode: str) -> None:
        self.mode = mode

    def take(self) -> tuple[int, bool]:
        return self.sync.take() if self.mode == "sync" else (self.shared, False)

    def record(self, threads: int, seconds: float, rows: int) -> None:
        if self.mode == "sync":
            self.sync.record(threads, seconds, rows)


__all__ = ["DECISIVE", "DECISIVE_LOSS", "MARGIN", "ModeThreads", "StageThreads", "ThreadCounts"]
