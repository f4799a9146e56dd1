"""A sync run's stage settles its intra-op threads on its own calls (freshroll.stage_threads)."""

from __future__ import annotations

import threading

import pytest

from freshroll.stage_threads import DECISIVE, DECISIVE_LOSS, MARGIN, ModeThreads, StageThreads


def _settle(s: StageThreads, per_row: dict[int, float], rows: int = 10) -> list[int]:
    """Drive ``s`` until settled; the counts its calls were given."""
    given = []
    while s.settled is None:
        n, timed = s.take()
        given.append(n)
        if timed:
            s.record(n, per_row[n] * rows, rows)
        assert len(given) < 50
    return given


def test_warm_up_then_alternating_trials_then_the_faster():
    s = StageThreads("train", many=4, warmup=1, trials=3)
    assert _settle(s, {1: 1.0, 4: 0.85}) == [4, 1, 4, 1, 4, 1, 4]  # 1.18x: every trial
    assert s.settled == 4 and s.gain() == pytest.approx(1.0 / 0.85)
    assert s.take() == (4, False)  # settled: untimed from now on
    assert "train 4 thread(s) (1.18x on 4" in s.describe()
    d = s.as_dict()
    assert d["settled"] == 4 and d["seconds_per_row"]["1"] == [1.0, 1.0, 1.0]


def test_threads_that_clearly_pay_are_kept_after_one_pair():
    s = StageThreads("train", many=2, warmup=1, trials=3)
    assert _settle(s, {1: 1.0, 2: 1.0 / (DECISIVE * 1.001)}) == [2, 1, 2]
    assert s.settled == 2 and s.timed == {1: [1.0], 2: [pytest.approx(1 / (DECISIVE * 1.001))]}
    # just below the early bar: the trials run their course, and many still wins the margin
    s = StageThreads("train", many=2, warmup=1, trials=3)
    assert _settle(s, {1: 1.0, 2: 1.0 / (DECISIVE * 0.999)}) == [2, 1, 2, 1, 2, 1, 2]
    assert s.settled == 2
    # early for one thread only far beyond an outlier: a many-thread call DECISIVE_LOSS x
    # slower (a core taken by another process) ends the trials after one pair ...
    s = StageThreads("train", many=2, warmup=0, trials=3)
    assert _settle(s, {1: 0.1, 2: 0.1 * DECISIVE_LOSS}) == [1, 2] and s.settled == 1
    assert s.gain() == pytest.approx(1 / DECISIVE_LOSS)
    # ... a slower one below that bar may be an outlier: the trials run their course
    s = StageThreads("train", many=2, warmup=0, trials=3)
    assert _settle(s, {1: 0.1, 2: 0.1 * DECISIVE_LOSS * 0.999}) == [1, 2, 1, 2, 1, 2]
    assert s.settled == 1


def test_many_threads_must_pay_the_margin_a_tie_goes_to_one():
    assert _settle(s := StageThreads("generate", 2), {1: 1.0, 2: 1.0}) and s.settled == 1
    barely = 1.0 / (MARGIN * 0.999)
    assert _settle(s := StageThreads("generate", 2), {1: 1.0, 2: barely}) and s.settled == 1
    paid = 1.0 / (MARGIN * 1.001)
    assert _settle(s := StageThreads("generate", 2), {1: 1.0, 2: paid}) and s.settled == 2
    assert _settle(s := StageThreads("generate", 2), {1: 0.7, 2: 1.0}) and s.settled == 1


def test_seconds_are_per_row_and_a_median_absorbs_one_outlier():
    s = StageThreads("generate", 2, warmup=0, trials=3)
    # per row: one 1.0, 0.9, 1.1; many 0.9, 8.0 (a burst), 0.8
    calls = [(1, 10.0, 10), (2, 7.2, 8), (1, 9.0, 10), (2, 40.0, 5), (1, 11.0, 10), (2, 5.6, 7)]
    for n, sec, rows in calls:
        assert s.take() == (n, True)
        s.record(n, sec, rows)
    assert s.settled == 2 and s.gain() == pytest.approx(1.0 / 0.9)


def test_records_of_another_count_or_after_settling_are_ignored():
    s = StageThreads("train", 2, warmup=0, trials=2)
    s.record(3, 1.0, 1)  # a count never tried
    s.record(1, 1.0, 0)  # no rows
    assert s.timed == {1: [], 2: []} and s.settled is None and s.gain() is None
    _settle(s, {1: 1.0, 2: 0.1})
    s.record(1, 0.0001, 1)
    assert s.settled == 2 and len(s.timed[1]) == 1  # 10x: settled after one pair


def test_workers_sharing_a_stage_are_handed_every_trial_once():
    s = StageThreads("generate", 2, warmup=1, trials=3)
    given: list[tuple[int, bool]] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(10):
            n, timed = s.take()
            with lock:
                given.append((n, timed))
            if timed:
                s.record(n, 0.9 if n == 2 else 1.0, 1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for _, timed in given if timed) == 6 and s.settled == 2


def test_nothing_to_choose_is_refused():
    with pytest.raises(ValueError, match="nothing to choose"):
        StageThreads("train", 1)
    with pytest.raises(ValueError, match="trials >= 2"):
        StageThreads("train", 2, trials=1)


def test_mode_threads_share_while_async_and_settle_in_sync_windows():
    t = ModeThreads(shared=1, sync=StageThreads("train", many=4, warmup=1, trials=2))
    assert t.stage == "train" and t.take() == (1, False)  # async: the placement's share
    t.record(1, 1.0, 10)  # an async call is never recorded
    t.set_mode("sync")
    given = []
    while t.sync.settled is None:  # the sync windows' calls settle the stage
        n, timed = t.take()
        given.append(n)
        if timed:
            t.record(n, {1: 1.0, 4: 0.9}[n] * 10, 10)
    assert given == [4, 1, 4, 1, 4] and t.take() == (4, False)
    assert t.sync.timed == {1: [1.0, 1.0], 4: [0.9, 0.9]}
    t.set_mode("async")
    assert t.take() == (1, False)
    t = ModeThreads(shared=1, sync=StageThreads("generate", many=2, warmup=0))
    t.set_mode("sync")
    n, timed = t.take()
    t.set_mode("async")  # switched while the call ran: its time is not a sync window's
    t.record(n, 1.0, 1)
    assert t.sync.timed == {1: [], 2: []}
    for shared in (0, 3):
        with pytest.raises(ValueError, match="need 1 <= shared <= 2"):
            ModeThreads(shared, StageThreads("train", 2))
