"""freshroll.figures.window: the freshness window's bound on the trainer (issue 26), on a
hand-built ledger with known numbers and on short simulated runs (P1, P2), where the
measured efficiency must stay under it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from freshroll.figures.fold import Fold
from freshroll.figures.summary import summarize_events
from freshroll.figures.window import WindowFold, render_window, window_bound
from freshroll.ledger import events as ev

P0, P1, P2 = "p0-aa", "p1-bb", "p2-cc"


def _ledger() -> list[ev.Event]:
    """η 1, B 2 (window 4 groups), groups of 2; g1, g2, g3, g5 ready after 10, 12, 14 and
    12 s (L = 12), g4 wholly discarded 6 s after its admission; steps of 4 and 5 s
    (λ = 2 / 4.5 groups/s): bound 4 / (2 / 4.5 x 12) = 0.75. In the window: g1, g2 16 s
    each (to the commit that trained them), g3 21 s, g5 17 s (to its stale discard), g4 6 s;
    over 22 s."""
    def req(ts: float, group: str) -> ev.Requested:
        return ev.Requested(ts=ts, group=group, prompt_id="p", size=2, version=P0)

    def ready(ts: float, group: str) -> ev.Ready:
        return ev.Ready(ts=ts, group=group, samples=[f"{group}.0#0", f"{group}.1#0"])

    def commit(ts: float, lease: str, version: str, parent: str) -> ev.Committed:
        return ev.Committed(ts=ts, lease=lease, version=version, parent=parent,
                            settings_digest="s", samples=[])

    return [
        ev.Opened(ts=0.0, run_id="t", incarnation=0, max_staleness=1, batch_groups=2,
                  group_size=2),
        req(0.0, "g1"), req(0.0, "g2"), req(1.0, "g3"), req(2.0, "g4"),
        ev.Discarded(ts=3.0, request="g4.0", reason="fenced", sample="g4.0#0"),  # re-issued
        req(4.0, "g5"),
        ev.Discarded(ts=6.0, request="g4.0", reason="deadline", sample="g4.0#1"),
        ev.Discarded(ts=8.0, request="g4.1", reason="deadline", sample="g4.1#0"),
        ready(10.0, "g1"), ready(12.0, "g2"),
        ev.Leased(ts=12.0, lease="l1", version=P0, groups=["g1", "g2"], wait_s=12.0),
        ready(15.0, "g3"), ready(16.0, "g5"),
        commit(16.0, "l1", P1, P0),
        ev.Leased(ts=16.0, lease="l2", version=P1, groups=["g3"]),
        ev.LeaseReleased(ts=16.5, lease="l2", reason="released"),
        ev.Leased(ts=17.0, lease="l3", version=P1, groups=["g3"]),
        ev.Discarded(ts=21.0, request="g5.0", reason="stale", sample="g5.0#0"),  # ready: whole
        ev.Discarded(ts=21.0, request="g5.1", reason="stale", sample="g5.1#0"),
        commit(22.0, "l3", P2, P1),
    ]


def test_the_bound_of_a_hand_built_ledger() -> None:
    fold = WindowFold()
    assert isinstance(fold, Fold) and fold.result() is None
    events = _ledger()
    for e in events:
        if type(e) in WindowFold.KINDS:
            fold.feed(e)
    w = fold.result()
    assert w is not None
    assert w["latency_s"] == pytest.approx(12.0) and w["ready_groups"] == 4
    assert w["discard_latency_s"] == pytest.approx(6.0) and w["discarded_groups"] == 1
    assert w["trainer_step_s"] == pytest.approx(4.5)  # (16 - 12 + 22 - 17) / 2
    assert w["trainer_groups_per_s"] == pytest.approx(2 / 4.5)
    assert w["window_groups"] == 4
    assert w["bound"] == pytest.approx(4 / (2 / 4.5 * 12.0))  # 0.75
    assert w["occupancy_groups"] == pytest.approx((16 + 16 + 21 + 17 + 6) / 22)
    assert w["occupancy_discarded"] == pytest.approx((17 + 6) / 22)
    assert not fold.groups and not fold.leases  # nothing kept past a group's or lease's end
    # summary.json carries it, the same numbers
    assert summarize_events(events)["window_bound"]["bound"] == pytest.approx(0.75)
    assert "window bound 0.75" in render_window(w) and "75% of the trainer's" in render_window(w)
    assert render_window({**w, "bound": 0.95}) == ""  # not the limit: the end says nothing
    assert render_window(w, max_staleness=0) == ""  # a sync run has no window to widen
    assert "window bound 0.75" in render_window(w, max_staleness=1)


def test_the_formula() -> None:
    assert window_bound(window_groups=96, trainer_groups_per_s=2.0, latency_s=96.0) == 0.5
    assert window_bound(window_groups=96, trainer_groups_per_s=2.0, latency_s=1.0) == 1.0
    for rate, latency in ((0.0, 1.0), (1.0, 0.0), (math.nan, 1.0), (1.0, math.inf)):
        assert math.isnan(window_bound(window_groups=4, trainer_groups_per_s=rate,
                                       latency_s=latency))
    assert render_window(None) == "" and render_window({"bound": None}) == ""


@pytest.mark.parametrize("profile", ["p1", "p2"])
def test_a_simulated_run_trains_no_faster_than_its_window_allows(
        tmp_path: Path, profile: str) -> None:
    """E (accepted/s over the run's own trainer capacity, λ × G) <= bound + a small margin
    for the run's edges, at η 2 (each config's) and at η 1."""
    from freshroll.config import load_config
    from freshroll.runtime.run import run

    root = Path(__file__).resolve().parents[2]
    for eta in (2, 1):
        cfg = load_config(root / "configs" / f"sim-{profile}.yaml",
                          ["run.steps=6", "run.progress=false", f"run.max_staleness={eta}"])
        result = run(cfg, tmp_path / f"eta{eta}", report=False)
        assert result.ok
        s = result.summary
        w = s["window_bound"]
        assert w["window_groups"] == (eta + 1) * cfg.rollout.batch_groups
        e = s["accepted_rollouts_per_s"] / (w["trainer_groups_per_s"]
                                             * cfg.rollout.group_size)
        assert 0 < w["bound"] <= 1 and 0 < e <= w["bound"] + 0.05, (profile, eta, e, w)


def test_the_report_names_the_bound_when_it_limits_the_trainer(tmp_path: Path) -> None:
    from freshroll.report.header import _segments_html
    from freshroll.report.rundata import RunData

    w = summarize_events(_ledger())["window_bound"]
    assert "window bound 0.75" in _segments_html(RunData(tmp_path, summary={"window_bound": w}))
    assert _segments_html(RunData(tmp_path, summary={"window_bound": {**w, "bound": 1.0}})) == ""
