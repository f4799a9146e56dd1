"""Recovery time and throughput under faults: pure figures over two ledgers' commits.

The faulted run and its fault-free twin have the same workload and seed, so step ``k`` of
one trains on much the same prompts as step ``k`` of the other: the figures compare the two
runs **step for step**, which cancels most of the workload's own variation (a small batch of
long-tailed completions makes a run's rate swing far more than 20% from window to window; a
bar against the twin's *mean* rate then reports that swing as a recovery time: the first
version of this module reported ~100 s for faults that cost nothing).

Step ``k`` is committed at ``T_f[k]`` in the faulted run and ``T_0[k]`` in the twin (step 0:
the run's first event). Over the span of steps ``k .. e`` (``e = min(k + WINDOW_STEPS, n)``,
``n`` the last step both committed) the faulted run's rate relative to the twin's is::

    ratio(k) = (T_0[e] - T_0[k]) / (T_f[e] - T_f[k])

(each step commits one batch in both runs). ``j0`` is the last step committed at or before
the first fault's ``fault_injected`` time ``t_f``.

**Recovery time**: the run is *recovered at step k >= j0* when ``ratio(k) >= RECOVERED``
(80%). Recovered at ``j0`` already: the span that contains the fault kept 80% of the twin's
pace, the fault cost nothing measurable at this resolution, recovery is 0. Otherwise
recovery is ``T_f[k] - t_f`` for the first such ``k`` (the outage, up to the first step from
which the run keeps pace again). None when no step qualifies (never recovered within the
run) or when there is nothing to compare (no fault, no step after it, no twin). The span of
six steps was chosen on the library's runs (24 steps of 8 rollouts): 4, 6 and 8 give the
same figure on all but 4 of 66 cases; three steps are too few (the two runs diverge after a
fault, and three-step rates swing 0.6x-1.4x on their own).

**Throughput under faults**: the faulted run's accepted rollouts/s over the fault-free run's
(:func:`freshroll.figures.metrics.accepted_rollouts_per_s` of each: one figure, one function).

Everything here is numbers in, numbers out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from freshroll.figures import metrics
from freshroll.ledger import events as ev

#: the share of the fault-free rate that counts as recovered
RECOVERED = 0.8
#: the span a rate is compared over, in steps
WINDOW_STEPS = 6


@dataclass(frozen=True)
class RunRates:
    """What the figures need from one run's ledger."""

    commits: tuple[tuple[float, int], ...]  # (ts, samples) of every committed step
    accepted_per_s: float  # metrics.accepted_rollouts_per_s
    steps: int
    wall_s: float  # metrics.wall_s
    first_fault_ts: float | None  # the first fault_injected event's ts
    start_ts: float | None = None  # the first event's ts (step 0's "commit")


def rates_of(events: Iterable[ev.Event]) -> RunRates:
    """Fold one ledger's events into :class:`RunRates`."""
    tally = metrics.Tally()
    commits: list[tuple[float, int]] = []
    first: float | None = None
    start: float | None = None
    for e in events:
        tally.feed(e)
        if start is None:
            start = e.ts
        if isinstance(e, ev.Committed):
            commits.append((e.ts, len(e.samples)))
        elif isinstance(e, ev.FaultInjected) and first is None:
            first = e.ts
    return RunRates(tuple(commits), metrics.accepted_rollouts_per_s(tally),
                    metrics.steps(tally), metrics.wall_s(tally), first, start)


def step_ratio(faulted: Sequence[float], baseline: Sequence[float], k: int, e: int) -> float:
    """``ratio`` over steps ``k .. e`` (times of steps 0..n; module docstring)."""
    took = faulted[e] - faulted[k]
    return float("inf") if took <= 0 else (baseline[e] - baseline[k]) / took


def recovery_time(faulted: Sequence[float], fault_ts: float | None, baseline: Sequence[float],
                  *, window: int = WINDOW_STEPS, share: float = RECOVERED) -> float | None:
    """Seconds from ``fault_ts`` until the faulted run keeps ``share`` of the twin's pace over
    the next ``window`` steps (module docstring).

    ``faulted``/``baseline``: the time of step 0 (the run's start) and of every commit after
    it, in step order."""
    n = min(len(faulted), len(baseline)) - 1  # the last step both runs committed
    if fault_ts is None or n < 1 or window < 1:
        return None
    j0 = max(0, bisect.bisect_right(faulted, fault_ts) - 1)
    for k in range(j0, n):
        if step_ratio(faulted, baseline, k, min(k + window, n)) >= share:
            return 0.0 if k == j0 else max(0.0, faulted[k] - fault_ts)
    return None


def step_times(rates: RunRates) -> list[float]:
    """Step 0 (the run's start) and every commit's time, in step order."""
    start = rates.start_ts if rates.start_ts is not None else (
        rates.commits[0][0] if rates.commits else 0.0)
    return [start, *(ts for ts, _ in rates.commits)]


def throughput_ratio(faulted_per_s: float, baseline_per_s: float) -> float | None:
    """Accepted rollouts/s under faults over fault-free (None: no fault-free rate)."""
    return faulted_per_s / baseline_per_s if baseline_per_s > 0 else None


def case_figures(faulted: RunRates, baseline: RunRates) -> tuple[float | None, float | None]:
    """(recovery time, throughput ratio) of one case."""
    rec = recovery_time(step_times(faulted), faulted.first_fault_ts, step_times(baseline))
    return rec, throughput_ratio(faulted.accepted_per_s, baseline.accepted_per_s)


__all__ = ["RECOVERED", "WINDOW_STEPS", "RunRates", "case_figures",
           "rates_of", "recovery_time", "step_ratio", "step_times", "throughput_ratio"]
