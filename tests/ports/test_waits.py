"""The waits in flight (ports/waits.py) against a fake clock: what is overdue, when a
heartbeat line is due, when a run is stalled and what the stop says."""

from __future__ import annotations

from freshroll.clock import VirtualClock
from freshroll.ports.waits import Waits, heartbeat, stall_message


def test_a_wait_is_overdue_past_the_heartbeat_and_said_once_per_interval():
    clock = VirtualClock()
    waits = Waits(clock, heartbeat_s=30)
    token = waits.begin("w0 generate", 600)
    clock.advance(29)
    assert waits.due(clock.now()) == []
    clock.advance(31)
    due = waits.due(clock.now())
    assert heartbeat(due, clock.now()) == "waiting 60 s on w0 generate, limit 600 s"
    clock.advance(10)
    assert waits.due(clock.now()) == []  # said 10 s ago
    clock.advance(20)
    assert [w.what for w in waits.due(clock.now())] == ["w0 generate"]
    waits.end(token)
    assert waits.overdue(clock.now()) == [] and waits.oldest() is None


def test_one_line_per_stage_its_oldest_wait_first():
    clock = VirtualClock()
    waits = Waits(clock, heartbeat_s=1)
    waits.begin("reward function 'f'", 300)
    clock.advance(2)
    waits.begin("w0 generate", 600)
    waits.begin("w0 generate", 600)  # a continuous worker's overlapping calls: one line
    clock.advance(1.5)
    assert heartbeat(waits.due(clock.now()), clock.now()) == (
        "waiting 3.5 s on reward function 'f', limit 300 s; "
        "waiting 1.5 s on w0 generate, limit 600 s")


def test_a_run_is_stalled_after_max_no_progress_s_without_a_step_and_says_on_what():
    clock = VirtualClock()
    waits = Waits(clock, heartbeat_s=30)
    with waits.waiting("w1 load weights", 300):
        clock.advance(100)
        assert not waits.stalled(clock.now(), 1)  # not counting before the workers are up
        waits.progressed()
        clock.advance(1799)
        assert not waits.stalled(clock.now(), 1800)
        clock.advance(1)
        assert waits.stalled(clock.now(), 1800)
        assert stall_message(waits, clock.now(), 1800, 7) == (
            "no trainer step committed for 1800 s (limits.max_no_progress_s=1800) after "
            "step 7; waiting 1900 s on w1 load weights, limit 300 s")
    assert stall_message(waits, clock.now(), 1800, 7).endswith(
        "nothing was in flight (every stage idle)")
