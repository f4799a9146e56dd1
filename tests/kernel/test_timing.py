"""Timing from ledger events: six stages per accepted sample, percentiles."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernel_driver import SimConfig, simulate

from freshroll.clock import VirtualClock
from freshroll.errors import LedgerError
from freshroll.figures.timing import (
    STAGES,
    collect_spans,
    decompose,
    format_table,
    percentile,
)
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.store import Ledger

P0, P1, P2 = "p0-aa", "p1-bb", "p2-cc"
R = "r:len:ab"


def _one_group() -> list[ev.Event]:
    """Group g0 of two requests; g0.0 needs a second attempt. Times are exact binary floats."""
    return [
        ev.Opened(ts=0.0, run_id="t", incarnation=0, max_staleness=1, batch_groups=1,
                  group_size=2),
        ev.PolicyPublished(ts=0.0, version=P0),
        ev.Requested(ts=1.0, group="g0", prompt_id="x", size=2, version=P0),
        ev.Started(ts=1.5, sample="g0.1#1", worker="w1", epoch=0, version=P0),
        ev.Started(ts=2.0, sample="g0.0#1", worker="w0", epoch=0, version=P0),
        ev.WorkerFenced(ts=2.5, worker="w0", epoch=0, reason="lost"),
        ev.Discarded(ts=2.5, request="g0.0", sample="g0.0#1", reason="fenced"),
        ev.PolicyPublished(ts=2.75, version=P1),
        ev.Started(ts=3.0, sample="g0.0#2", worker="w0", epoch=1, version=P1),
        ev.Generated(ts=4.0, sample="g0.1#1", tokens=5, gen_s=2.0),
        ev.Rewarded(ts=4.5, sample="g0.1#1", reward=1.0, reward_version=R, reward_s=0.5),
        ev.Generated(ts=5.0, sample="g0.0#2", tokens=7, gen_s=1.5),
        ev.Rewarded(ts=5.25, sample="g0.0#2", reward=0.0, reward_version=R),
        ev.Ready(ts=5.25, group="g0", samples=["g0.1#1", "g0.0#2"]),
        ev.Leased(ts=6.0, lease="l0", version=P1, groups=["g0"], wait_s=0.5),
        ev.Committed(ts=8.0, lease="l0", version=P2, parent=P1, settings_digest="s",
                     samples=["g0.1#1", "g0.0#2"], train_s=2.0),
    ]


#: hand-computed, per committed sample in commit order (g0.1#1, g0.0#2)
EXPECTED = {
    "queue": [0.5, 2.0],        # started (of the committed attempt) - requested
    "generation": [2.0, 1.5],   # gen_s
    "transfer": [0.5, 0.5],     # generated - started - gen_s
    "reward": [0.5, 0.25],      # rewarded - generated
    "buffer": [1.5, 0.75],      # leased - rewarded
    "trainer": [2.0, 2.0],      # committed - leased
}


def test_six_stages_match_hand_computed_values() -> None:
    spans = collect_spans(_one_group())
    assert spans.stages == EXPECTED
    assert spans.total == [7.0, 7.0]  # committed - requested
    for i, total in enumerate(spans.total):
        assert sum(spans.stages[s][i] for s in STAGES) == total
    # lease version p1 minus the generating version: one lag definition, in
    # freshroll.figures.metrics
    from freshroll.figures.metrics import lag_histogram, tally

    assert lag_histogram(tally(_one_group())) == {"0": 1, "1": 1}


def test_decompose_percentiles_means_and_shares() -> None:
    rows = {r.stage: r for r in decompose(collect_spans(_one_group()))}
    assert list(rows) == list(STAGES)
    q = rows["queue"]
    assert q.p50 == 1.25 and q.mean == 1.25
    assert q.p95 == pytest.approx(0.5 + 1.5 * 0.95)
    assert q.p99 == pytest.approx(0.5 + 1.5 * 0.99)
    assert q.share == pytest.approx(2.5 / 14.0)
    assert rows["trainer"].share == pytest.approx(4.0 / 14.0)
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)
    table = format_table(list(rows.values()))
    lines = table.splitlines()
    assert lines[0].split() == ["stage", "p50", "s", "p95", "s", "p99", "s", "mean", "s", "share"]
    assert [line.split()[0] for line in lines[1:]] == list(STAGES)
    assert "17.9%" in lines[1]  # queue share


def test_only_committed_samples_get_spans() -> None:
    events = _one_group()[:-1]  # leased, never committed
    spans = collect_spans(events)
    assert spans.total == [] and all(v == [] for v in spans.stages.values())
    rows = decompose(spans)
    assert all(r.p50 == r.mean == r.share == 0.0 for r in rows)


def test_stages_still_add_up_when_the_worker_reports_more_than_its_span() -> None:
    """A worker clock that claims gen_s longer than started->generated is capped."""
    events = _one_group()
    i = next(i for i, e in enumerate(events)
             if isinstance(e, ev.Generated) and e.sample == "g0.1#1")
    events[i] = ev.Generated(ts=4.0, sample="g0.1#1", tokens=5, gen_s=9.0)  # span is 2.5
    spans = collect_spans(events)
    assert spans.stages["generation"][0] == 2.5
    assert spans.stages["transfer"][0] == 0.0
    for i, total in enumerate(spans.total):
        assert sum(spans.stages[s][i] for s in STAGES) == total


def test_missing_events_give_a_ledger_error_not_a_key_error() -> None:
    events = [e for e in _one_group()
              if not (isinstance(e, ev.Started) and e.sample == "g0.0#2")]
    with pytest.raises(LedgerError, match=r"g0\.0#2"):
        collect_spans(events)


def test_simulated_run_stages_add_up(tmp_path: Path) -> None:
    simulate(tmp_path / "run", KernelConfig(1, 2, 4),
             SimConfig(steps=8, seed=3, faults=True, sync="off"), VirtualClock())
    with Ledger(tmp_path / "run" / "ledger.sqlite", readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    spans = collect_spans(events)
    committed = sum(len(e.samples) for e in events if isinstance(e, ev.Committed))
    assert len(spans.total) == committed > 0
    for i, total in enumerate(spans.total):
        parts = [spans.stages[s][i] for s in STAGES]
        assert all(p >= 0 for p in parts)
        assert math.isclose(sum(parts), total, rel_tol=1e-9, abs_tol=1e-9)
    from freshroll.figures.metrics import lag_histogram, tally

    lags = lag_histogram(tally(events))
    assert sum(lags.values()) == committed and set(lags) <= {"0", "1"}  # max_staleness 1


# -- percentile --------------------------------------------------------------------------
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.floats(0, 100),
)
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    expected = float(np.percentile(np.array(values), q, method="linear"))
    assert percentile(values, q) == pytest.approx(expected, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([], 50, 0.0),
    ([3.0], 99, 3.0),
    ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
    ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
    ([4.0, 1.0, 3.0, 2.0], 50, 2.5),
    ([1.0, 2.0, 3.0, 4.0, 5.0], 25, 2.0),
    ([10.0, 20.0], 95, 19.5),
])
def test_percentile_known_values(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)
    if values:
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_does_not_mutate_its_input() -> None:
    values = [3.0, 1.0, 2.0]
    percentile(values, 50)
    assert values == [3.0, 1.0, 2.0]
