"""The end-of-run verdict says plainly when a run trained less than asked, and why."""

from __future__ import annotations

from freshroll.figures.verdict import render, verdict
from freshroll.ledger import events as ev


def _opened() -> ev.Opened:
    return ev.Opened(ts=0.0, run_id="r", incarnation=0, max_staleness=1, batch_groups=1,
                     group_size=2)


def _committed(step: int) -> ev.Committed:
    return ev.Committed(ts=1.0, lease="l", version=f"p{step}-x", parent="p0-x",
                        settings_digest="s", samples=[])


def _discard(reason: str, detail: str) -> ev.Discarded:
    return ev.Discarded(ts=1.0, request="g1.0", reason=reason, detail=detail)  # type: ignore[arg-type]


def test_a_run_that_committed_nothing_says_so_with_the_first_error() -> None:
    events = [_opened(), _discard("reward_error", "score: KeyError: 'solution'"),
              _discard("reward_error", "score: KeyError: 'other'"),
              _discard("shutdown", "failed"), ev.Closed(ts=2.0, reason="failed")]
    v = verdict(events, 3)
    assert v["status"] == "no steps" and v["steps_committed"] == 0
    assert v["first_failure"] == {"reward_error": {"count": 2,
                                                   "first": "score: KeyError: 'solution'"}}
    text = render(v)
    assert "committed 0 of 3 steps" in text and "KeyError: 'solution'" in text
    assert "shutdown" not in text  # bookkeeping, not a failure


def test_fewer_steps_than_asked_is_incomplete() -> None:
    v = verdict([_opened(), _committed(1), ev.Closed(ts=3.0, reason="failed: boom")], 5)
    assert v["status"] == "incomplete" and v["stopped"] == "failed: boom"
    assert "committed 1 of 5" in render(v)


def test_a_complete_run_is_quiet_about_stale_discards() -> None:
    events = [_opened(), _committed(1), _discard("stale", "lag 2 > 1"), ev.Closed(ts=3.0)]
    v = verdict(events, 1)
    assert v["status"] == "complete" and render(v) == ""


def test_a_complete_run_still_shows_reward_errors() -> None:
    events = [_opened(), _committed(1), _discard("reward_error", "nan"), ev.Closed(ts=3.0)]
    assert "1 reward_error discards; first: nan" in render(verdict(events, 1))


def test_a_ledger_that_never_closed_is_open() -> None:
    v = verdict([_opened(), _committed(1), ev.Closed(ts=1.0), _opened()], 5)
    assert v["status"] == "open" and "--resume" in render(v)
