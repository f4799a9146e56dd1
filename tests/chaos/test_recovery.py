"""Recovery time and throughput under faults: pure figures over (ts, n) commits."""

from __future__ import annotations

import pytest

from freshroll import events as ev
from freshroll.chaos import recovery as rc


def steady(t0: float, t1: float, every: float, n: int = 8) -> list[tuple[float, int]]:
    out, t = [], t0
    while t <= t1 + 1e-9:
        out.append((round(t, 6), n))
        t += every
    return out


def test_windowed_rate_counts_the_commits_inside_the_window() -> None:
    commits = [(1.0, 8), (2.0, 8), (3.0, 8), (10.0, 8)]
    assert rc.windowed_rates(commits, 3.0) == pytest.approx([8 / 3, 16 / 3, 24 / 3, 8 / 3])


def test_no_dip_recovers_at_the_first_commit_after_the_fault() -> None:
    commits = steady(1.0, 60.0, 1.0)  # 8/s throughout
    assert rc.recovery_time(commits, 10.5, 8.0, 3.0) == pytest.approx(0.5)


def test_a_stall_recovers_once_the_window_is_full_again() -> None:
    commits = steady(1.0, 10.0, 1.0) + steady(30.0, 60.0, 1.0)  # nothing in (10, 30)
    # at t=30: one commit in the window (8/3 < 6.4); t=31: 16/3 < 6.4; t=32: 8 >= 6.4
    assert rc.recovery_time(commits, 10.5, 8.0, 3.0) == pytest.approx(32.0 - 10.5)


def test_a_late_dip_after_a_quick_first_commit_still_counts() -> None:
    # buffered groups keep the trainer busy at first, then the rate falls, then comes back
    commits = steady(1.0, 14.0, 1.0) + steady(20.0, 60.0, 1.0)
    assert rc.recovery_time(commits, 10.5, 8.0, 3.0) == pytest.approx(22.0 - 10.5)


def test_never_recovered_and_nothing_to_compare_are_none() -> None:
    slow = steady(1.0, 10.0, 1.0) + steady(12.0, 60.0, 4.0)  # 2/s after the fault
    assert rc.recovery_time(slow, 10.5, 8.0, 3.0) is None
    assert rc.recovery_time(steady(1.0, 10.0, 1.0), 10.5, 8.0, 3.0) is None  # no commit after
    assert rc.recovery_time(slow, None, 8.0, 3.0) is None
    assert rc.recovery_time(slow, 10.5, 0.0, 3.0) is None
    assert rc.recovery_time(slow, 10.5, 8.0, None) is None


def test_the_bar_is_eighty_percent() -> None:
    commits = steady(1.0, 60.0, 1.0, n=7)  # 7/s against 8/s: 87.5%
    assert rc.recovery_time(commits, 5.5, 8.0, 3.0) == pytest.approx(0.5)
    commits = steady(1.0, 60.0, 1.0, n=6)  # 75%
    assert rc.recovery_time(commits, 5.5, 8.0, 3.0) is None


def test_throughput_ratio() -> None:
    assert rc.throughput_ratio(6.0, 8.0) == pytest.approx(0.75)
    assert rc.throughput_ratio(6.0, 0.0) is None


def _committed(ts: float, n: int, lease: str) -> list[ev.Event]:
    return [ev.Leased(ts=ts, lease=lease, version="p0-00", groups=[], wait_s=0.0),
            ev.Committed(ts=ts, lease=lease, version="v", parent="p", settings_digest="s",
                         samples=[f"g{lease}.{i}#0" for i in range(n)])]


def test_rates_of_a_ledger_and_the_case_figures() -> None:
    base_events: list[ev.Event] = [ev.Opened(ts=0.0, run_id="b", incarnation=0,
                                             max_staleness=1, batch_groups=1, group_size=8)]
    for k in range(10):
        base_events += _committed(float(k + 1), 8, str(k))
    base = rc.rates_of(base_events)
    assert base.steps == 10 and base.first_fault_ts is None
    assert base.accepted_per_s == pytest.approx(80 / 9)  # trainer wall from the first lease
    assert rc.window_s(base) == pytest.approx(3 * 9 / 10)
    faulted_events = list(base_events[:1])
    for k in range(5):
        faulted_events += _committed(float(k + 1), 8, str(k))
    faulted_events.append(ev.FaultInjected(ts=5.5, fault="stall_trainer", target="trainer",
                                           detail="#0 stall"))
    for k in range(5, 10):
        faulted_events += _committed(float(k + 10), 8, str(k))
    f = rc.rates_of(faulted_events)
    assert f.first_fault_ts == 5.5
    rec, thr = rc.case_figures(f, base)
    assert rec is not None and rec > 9.0  # the stall, plus the window filling again
    assert thr == pytest.approx((80 / 18) / (80 / 9))


def test_a_dip_long_after_recovery_does_not_count() -> None:
    # recovered at once; an unrelated dip 30 s later (past two windows) is not the fault's
    commits = steady(1.0, 40.0, 1.0) + steady(50.0, 80.0, 1.0)
    assert rc.recovery_time(commits, 10.5, 8.0, 3.0) == pytest.approx(0.5)


def test_the_rate_falls_when_commits_leave_the_window() -> None:
    commits = [(1.0, 8), (2.0, 8), (3.0, 8)]
    assert rc.rate_at(commits, 3.0, 3.0) == pytest.approx(8.0)
    assert rc.rate_at(commits, 4.0, 3.0) == pytest.approx(16 / 3)
    assert rc.rate_at(commits, 6.0, 3.0) == 0.0
