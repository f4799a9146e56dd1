"""Recovery time and throughput under faults: pure figures over two ledgers' commits.

Accepted rollouts per second over a sliding window ``W`` (three fault-free step times,
``W = 3 x baseline wall / baseline steps``), evaluated at each commit ``t``::

    rate(t) = (samples committed in (t - W, t]) / W

**Recovery time**: from the first fault's ``fault_injected`` timestamp ``t_f`` until the
windowed rate is back to at least ``RECOVERED`` (80%) of the fault-free run's mean rate and
holds there for ``SUSTAIN_WINDOWS`` (2) windows: the first commit ``t_j >= t_f`` such that
``rate(p) >= 0.8 x base`` at every point ``p`` in ``[t_j, min(t_j + 2W, last commit)]``;
recovery is ``t_j - t_f``. The points checked are the commits, and one point inside every
gap between two commits longer than the window (where the rate is 0), so a stall counts
even when no commit falls inside it. (Not every point where a commit leaves the window:
with three step times per window, the jitter of step times would dip there below 80% in
any run.) Holding for two windows (not to the end of the run) keeps a fault's delayed dip
(the trainer first drains what the buffer holds, then starves) and leaves out unrelated
dips much later. None when no commit after
the fault holds the bar (never recovered within the run), or when there is no fault-free
rate to compare with.

**Throughput under faults**: the faulted run's accepted rollouts/s over the fault-free run's
(:func:`freshroll.metrics.accepted_rollouts_per_s` of each: one figure, one function).

Both runs have the same workload and seed. Everything here is numbers in, numbers out.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from freshroll import events as ev
from freshroll import metrics

#: the share of the fault-free rate that counts as recovered
RECOVERED = 0.8
#: the window, in fault-free step times
WINDOW_STEPS = 3
#: how long the rate must hold the bar, in windows
SUSTAIN_WINDOWS = 2


@dataclass(frozen=True)
class RunRates:
    """What the figures need from one run's ledger."""

    commits: tuple[tuple[float, int], ...]  # (ts, samples) of every committed step
    accepted_per_s: float  # metrics.accepted_rollouts_per_s
    steps: int
    wall_s: float  # metrics.wall_s
    first_fault_ts: float | None  # the first fault_injected event's ts


def rates_of(events: Iterable[ev.Event]) -> RunRates:
    """Fold one ledger's events into :class:`RunRates`."""
    tally = metrics.Tally()
    commits: list[tuple[float, int]] = []
    first: float | None = None
    for e in events:
        tally.feed(e)
        if isinstance(e, ev.Committed):
            commits.append((e.ts, len(e.samples)))
        elif isinstance(e, ev.FaultInjected) and first is None:
            first = e.ts
    return RunRates(tuple(commits), metrics.accepted_rollouts_per_s(tally),
                    metrics.steps(tally), metrics.wall_s(tally), first)


def window_s(baseline: RunRates) -> float | None:
    """``WINDOW_STEPS`` fault-free step times (None: the baseline committed nothing)."""
    if baseline.steps <= 0 or baseline.wall_s <= 0:
        return None
    return WINDOW_STEPS * baseline.wall_s / baseline.steps


def windowed_rates(commits: Sequence[tuple[float, int]], window: float) -> list[float]:
    """``rate(t_k)`` at every commit ``t_k`` (commits in time order)."""
    out, lo, inside = [], 0, 0
    for ts, n in commits:
        inside += n
        while commits[lo][0] <= ts - window:
            inside -= commits[lo][1]
            lo += 1
        out.append(inside / window)
    return out


def rate_at(commits: Sequence[tuple[float, int]], t: float, window: float) -> float:
    """``rate(t)``: samples committed in ``(t - window, t]`` per second."""
    return sum(n for ts, n in commits if t - window < ts <= t) / window


def recovery_time(commits: Sequence[tuple[float, int]], fault_ts: float | None,
                  base_rate: float, window: float | None, share: float = RECOVERED,
                  sustain: float | None = None) -> float | None:
    """Seconds from ``fault_ts`` until the windowed rate is back to ``share x base_rate``
    and holds for ``sustain`` seconds (default ``SUSTAIN_WINDOWS`` windows; module
    docstring); None if never, or nothing to compare."""
    if fault_ts is None or window is None or window <= 0 or base_rate <= 0 or not commits:
        return None
    hold = SUSTAIN_WINDOWS * window if sustain is None else sustain
    last = commits[-1][0]
    # the rate at every commit, and 0 inside every gap between commits longer than a window
    gaps = {a + window for (a, _), (b, _) in itertools.pairwise(commits)
            if b - a > window}
    points = sorted({ts for ts, _ in commits} | gaps)
    bar = share * base_rate
    low = [p for p in points if p >= fault_ts and rate_at(commits, p, window) < bar]
    for ts, _ in commits:
        if ts < fault_ts:
            continue
        end = min(ts + hold, last)
        if not any(ts <= p <= end for p in low):
            return ts - fault_ts
    return None


def throughput_ratio(faulted_per_s: float, baseline_per_s: float) -> float | None:
    """Accepted rollouts/s under faults over fault-free (None: no fault-free rate)."""
    return faulted_per_s / baseline_per_s if baseline_per_s > 0 else None


def case_figures(faulted: RunRates, baseline: RunRates) -> tuple[float | None, float | None]:
    """(recovery time, throughput ratio) of one case."""
    rec = recovery_time(faulted.commits, faulted.first_fault_ts, baseline.accepted_per_s,
                        window_s(baseline))
    return rec, throughput_ratio(faulted.accepted_per_s, baseline.accepted_per_s)


__all__ = ["RECOVERED", "SUSTAIN_WINDOWS", "WINDOW_STEPS", "RunRates", "case_figures",
           "rate_at", "rates_of", "recovery_time", "throughput_ratio", "window_s", "windowed_rates"]
