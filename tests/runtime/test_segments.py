"""Tests for freshroll.figures.segments: a run described segment by segment (issue 28 defect 6)."""

from __future__ import annotations

import msgspec
import pytest
from tests.pipeline.test_fallback import _decided
from tests.runtime.test_overlap import B, _ledger

from freshroll.figures.segments import render_segments
from freshroll.figures.summary import fold_events
from freshroll.ledger import events as ev


def _shifted(events: list[ev.Event], dt: float) -> list[ev.Event]:
    return [msgspec.structs.replace(e, ts=e.ts + dt) for e in events]


def _fell_back_then_resumed_async() -> list[ev.Event]:
    """Segment 1: 10 steps whose fallback chose sync; segment 2: 6 steps of a real overlap,
    never probed (too short), so only its own estimate can judge it."""
    n = 10
    first = _ledger([(float(k), k + 1.0) for k in range(n)],
                    [(k + 1.0, k + 2.0) for k in range(n)])
    decided = [_decided(4, "sync", "probe", 2.0 * B, None),  # after step 4's commit
               _decided(8, "sync", "chose", 2.0 * B, 2.2 * B)]
    first = sorted(first + [msgspec.structs.replace(e, ts=e.ts + 1.5) for e in decided],
                   key=lambda e: e.ts)
    m = 6
    second = _ledger([(float(k), k + 1.0) for k in range(m)],
                     [(k + 1.0, k + 2.0) for k in range(m)])
    return first + _shifted(second, 100.0)


def test_each_segment_has_its_own_figures_and_verdict():
    s = fold_events(_fell_back_then_resumed_async()).summary()
    one, two = s["segments"]
    assert (one["segment"], one["from_step"], one["to_step"], one["steps"]) == (1, 0, 10, 10)
    assert (two["segment"], two["from_step"], two["to_step"], two["steps"]) == (2, 10, 16, 6)
    assert one["overlap"]["verdict"] == "did not pay"
    assert one["overlap"]["verdict_source"] == "measured"
    assert two["overlap"]["verdict"] == "paid" and two["overlap"]["verdict_source"] == "estimated"
    assert one["accepted_rollouts"] + two["accepted_rollouts"] == s["accepted_rollouts"]
    assert one["stopped"] == two["stopped"] == "done"
    # the whole run: the first segment's measured choice no longer speaks for the resume
    assert s["overlap"]["verdict_source"] == "estimated"
    assert s["overlap"]["fallback"]["mode"] is None
    assert s["overlap"]["fallback"]["steps"] == {"async": 4 + 6, "sync": 6}


def test_segment_lines_say_each_mode_rate_and_end():
    segs = fold_events(_fell_back_then_resumed_async()).summary()["segments"]
    text = render_segments(segs)
    lines = text.splitlines()
    assert lines[0] == "this run in 2 segments (a start and 1 resume):"
    assert lines[1].startswith("  1: steps 1-10, async (max_staleness 1): ")
    assert "asynchrony did not pay (measured by the sync fallback; steps async/sync 4/6)" \
        in lines[1]
    assert lines[2].startswith("  2: steps 11-16, async (max_staleness 1): ")
    assert "asynchrony paid (" in lines[2] and lines[2].endswith("ended: done")


def test_a_killed_segment_and_one_segment():
    one = _ledger([(0.0, 1.0), (1.0, 2.0)], [(1.0, 2.0), (2.0, 3.0)])
    killed = one[:-1]  # no closed event: the process was killed
    segs = fold_events(killed + _shifted(one, 50.0)).summary()["segments"]
    assert [s["stopped"] for s in segs] == [None, "done"]
    assert "ended without closing (killed)" in render_segments(segs).splitlines()[1]
    (only,) = fold_events(one).summary()["segments"]
    assert only["steps"] == 2 and render_segments([only]) == ""


@pytest.mark.parametrize("n_resumes", [2, 3])
def test_many_resumes_count_every_step_once(n_resumes: int):
    one = _ledger([(0.0, 1.0), (1.0, 2.0)], [(1.0, 2.0), (2.0, 3.0)])
    events = [e for k in range(n_resumes + 1) for e in _shifted(one, 50.0 * k)]
    segs = fold_events(events).summary()["segments"]
    assert [(s["from_step"], s["to_step"]) for s in segs] == [
        (2 * k, 2 * k + 2) for k in range(n_resumes + 1)]
    assert f"a start and {n_resumes} resumes" in render_segments(segs)
