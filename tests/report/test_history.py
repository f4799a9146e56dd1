"""The run's history (freshroll.figures.history) and the report's History section."""

from __future__ import annotations

import json

from freshroll.figures.history import HistoryFold
from freshroll.ledger import events as ev
from freshroll.report.history import MAX_ROWS, history_section

P0, P1 = "p0-aa", "p1-bb"


def _live(workers: int, limit: int = 4) -> ev.LiveSettings:
    return ev.LiveSettings(admission_limit=limit, concurrency=2, workers=workers)


def _events() -> list[ev.Event]:
    return [
        ev.Opened(ts=100.0, run_id="r", incarnation=0, max_staleness=1, batch_groups=2,
                  group_size=2),
        ev.ControllerDecided(ts=101.0, mode="adaptive", previous=_live(2), settings=_live(2),
                             bottleneck="balanced", reason="hold", inputs={}, state={}),
        ev.Committed(ts=102.0, lease="l1", version=P1, parent=P0, settings_digest="s",
                     samples=[]),
        ev.WorkerFenced(ts=103.0, worker="w1", epoch=0, reason="lost", detail="killed"),
        ev.WorkerFenced(ts=103.5, worker="w0", epoch=0, reason="retired"),  # not a loss
        ev.WorkerReady(ts=104.0, worker="w1", epoch=1, startup_s=0.5),
        ev.WorkerReady(ts=104.1, worker="w2", epoch=0, startup_s=0.5),  # a first start
        ev.ModeDecided(ts=105.0, step=1, mode="sync", lookahead=0, phase="chose",
                       reason="async 0.8x"),
        ev.ControllerDecided(ts=106.0, mode="adaptive", previous=_live(2), settings=_live(3, 6),
                             bottleneck="producer", reason="trainer waits", inputs={}, state={}),
        ev.FaultInjected(ts=107.0, fault="kill_worker", target="w1"),
        ev.TrainerRestarted(ts=108.0, lease="l2", version=P1, restart=1, reason="lost",
                            rebuild_s=1.25),
        ev.Closed(ts=109.0, reason="interrupted"),
        ev.Opened(ts=200.0, run_id="r", incarnation=1, max_staleness=1, batch_groups=2,
                  group_size=2),
        ev.SettingsChanged(ts=200.5, step=1, keys=["trainer.lr"], old=json.dumps(
            {"trainer.lr": 0.001}), new=json.dumps({"trainer.lr": 0.0005}),
            allowed=["trainer.lr"]),
    ]


def test_every_kind_of_happening_is_one_entry_in_ledger_order() -> None:
    h = HistoryFold()
    for e in _events():
        if type(e) in HistoryFold.KINDS:
            h.feed(e)
    got = [(e.t, e.step, e.lane, e.text) for e in h.entries]
    assert got == [
        (0.0, 0, "segments", "started: max_staleness 1"),
        (3.0, 1, "workers", "w1 epoch 0 lost: killed"),
        (4.0, 1, "workers", "w1 epoch 1 ready again (0.5 s to start)"),
        (5.0, 1, "mode", "sync (chose): async 0.8x"),
        (6.0, 1, "controller", "workers 2 -> 3, admission limit 4 -> 6 (producer: trainer "
                               "waits)"),
        (7.0, 1, "faults", "kill_worker on w1"),
        (8.0, 1, "trainer", "trainer restarted (lost, restart 1, rebuilt in 1.2 s)"),
        (9.0, 1, "segments", "closed: interrupted"),
        (100.0, 1, "segments", "resumed (incarnation 1): max_staleness 1"),
        (100.5, 1, "settings", "changed at step 1: trainer.lr 0.001 -> 0.0005"),
    ]
    assert h.decisions == 2 and [c.workers for c in h.controls] == [2, 3]


def test_the_section_draws_the_timeline_and_lists_the_entries() -> None:
    h = HistoryFold()
    for e in _events():
        h.feed(e)
    html = history_section(h)
    assert html.count("<svg ") == 1 and 'aria-label="run history"' in html
    assert "1 controller decision(s) kept every setting" in html
    assert "<td>trainer.lr" not in html and "changed at step 1: trainer.lr" in html
    assert history_section(None) == "<p>No readable ledger: no history.</p>"
    quiet = HistoryFold()
    quiet.feed(ev.Opened(ts=0.0, run_id="r", incarnation=0, max_staleness=0, batch_groups=1,
                         group_size=1))
    assert "started: max_staleness 0" in history_section(quiet)
    busy = HistoryFold()
    for i in range(MAX_ROWS + 5):
        busy.feed(ev.FaultInjected(ts=float(i), fault="delay", target="w0"))
    assert "... and 5 more entries" in history_section(busy)
