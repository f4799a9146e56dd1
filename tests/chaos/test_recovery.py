"""Recovery time and throughput under faults: pure figures, the faulted run beside its
fault-free twin step for step."""

from __future__ import annotations

import random

import pytest

from freshroll.chaos import recovery as rc
from freshroll.ledger import events as ev


def times(*gaps: float, start: float = 0.0) -> list[float]:
    """Step 0 at ``start``, then one commit after each gap."""
    out = [start]
    for g in gaps:
        out.append(out[-1] + g)
    return out


def test_a_fault_that_costs_nothing_recovers_at_once() -> None:
    base = times(*[1.0] * 20)
    assert rc.recovery_time(base, 5.5, base) == 0.0


def test_the_workloads_own_swings_are_not_a_recovery_time() -> None:
    # a small batch of long-tailed completions: step times swing 0.2 s .. 3 s in BOTH runs
    # (same seed); against the twin's mean rate the old bar reported most of the run
    rng = random.Random(7)
    base = times(*[rng.choice([0.2, 0.5, 1.0, 3.0]) for _ in range(30)])
    assert rc.recovery_time(base, 4.0, base) == 0.0


def test_a_stall_recovers_at_the_first_step_that_keeps_pace_again() -> None:
    base = times(*[1.0] * 20)
    faulted = times(*[1.0] * 5, 20.0, *[1.0] * 14)  # nothing for 20 s after step 5
    # step 5 at 5.0 (<= the fault at 5.5): its window spans the stall; step 6 at 25.0 on
    # keeps the twin's pace
    assert rc.recovery_time(faulted, 5.5, base) == pytest.approx(25.0 - 5.5)


def test_a_late_dip_within_the_span_counts() -> None:
    # buffered groups keep the trainer busy for two steps after the fault, then it starves
    base = times(*[1.0] * 30)
    faulted = times(*[1.0] * 7, 10.0, *[1.0] * 22)
    assert rc.recovery_time(faulted, 5.5, base) == pytest.approx(faulted[8] - 5.5)


def test_a_dip_long_after_recovery_does_not_count() -> None:
    base = times(*[1.0] * 40)
    faulted = times(*[1.0] * 25, 10.0, *[1.0] * 14)  # a dip 20 steps after the fault
    assert rc.recovery_time(faulted, 5.5, base) == 0.0


def test_a_small_cost_within_the_span_is_no_recovery_time() -> None:
    base = times(*[1.0] * 20)
    faulted = times(*[1.0] * 5, 2.0, *[1.0] * 14)  # one slow step: 6/7 of the pace
    assert rc.recovery_time(faulted, 5.5, base) == 0.0


def test_the_bar_is_eighty_percent_of_the_twins_pace() -> None:
    base = times(*[1.0] * 20)
    assert rc.recovery_time(times(*[1.0] * 5, *[1.2] * 15), 5.5, base) == 0.0  # 83%
    assert rc.recovery_time(times(*[1.0] * 5, *[1.3] * 15), 5.5, base) is None  # 77%


def test_never_recovered_and_nothing_to_compare_are_none() -> None:
    base = times(*[1.0] * 20)
    slow = times(*[1.0] * 5, *[2.0] * 15)
    assert rc.recovery_time(slow, 5.5, base) is None
    assert rc.recovery_time(slow, None, base) is None  # no fault
    assert rc.recovery_time(times(*[1.0] * 5), 5.5, base) is None  # no step after the fault
    assert rc.recovery_time(slow, 5.5, [0.0]) is None  # a twin with no step


def test_throughput_ratio() -> None:
    assert rc.throughput_ratio(6.0, 8.0) == pytest.approx(0.75)
    assert rc.throughput_ratio(6.0, 0.0) is None


def _committed(ts: float, n: int, lease: str) -> list[ev.Event]:
    return [ev.Leased(ts=ts, lease=lease, version="p0-00", groups=[], wait_s=0.0),
            ev.Committed(ts=ts, lease=lease, version="v", parent="p", settings_digest="s",
                         samples=[f"g{lease}.{i}#0" for i in range(n)])]


def test_rates_of_a_ledger_and_the_case_figures() -> None:
    opened = ev.Opened(ts=0.0, run_id="b", incarnation=0, max_staleness=1, batch_groups=1,
                       group_size=8)
    base_events: list[ev.Event] = [opened]
    for k in range(10):
        base_events += _committed(float(k + 1), 8, str(k))
    base = rc.rates_of(base_events)
    assert base.steps == 10 and base.first_fault_ts is None and base.start_ts == 0.0
    assert rc.step_times(base) == [float(k) for k in range(11)]
    assert base.accepted_per_s == pytest.approx(80 / 9)  # trainer wall from the first lease
    faulted_events: list[ev.Event] = [opened]
    for k in range(5):
        faulted_events += _committed(float(k + 1), 8, str(k))
    faulted_events.append(ev.FaultInjected(ts=5.5, fault="stall_trainer", target="trainer",
                                           detail="#0 stall"))
    for k in range(5, 10):
        faulted_events += _committed(float(k + 10), 8, str(k))
    f = rc.rates_of(faulted_events)
    assert f.first_fault_ts == 5.5
    rec, thr = rc.case_figures(f, base)
    assert rec == pytest.approx(15.0 - 5.5)  # step 6 at 15 keeps the twin's pace
    assert thr == pytest.approx((80 / 18) / (80 / 9))
