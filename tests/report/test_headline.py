"""One answer to "did asynchrony pay" (:mod:`freshroll.figures.headline`): the most direct
reading a run has, its source named; the summary block, the end line and the report card."""

from __future__ import annotations

import json
from pathlib import Path

from freshroll.figures.headline import headline, render_headline
from freshroll.runtime.endfiles import ASYNCHRONY, write_summary


def _summary(**overlap: object) -> dict:
    return {"max_staleness": 1, "accepted_rollouts_per_s": 150.0,
            "overlap": {"verdict": "paid", "verdict_source": "estimated", "ratio": 1.36,
                        "sync_estimate_per_s": 110.0, "fallback": None, **overlap}}


def _probe(ratio: float, reused: bool = False) -> dict:
    return {"step": 20, "async_per_s": 150.0, "sync_per_s": 150.0 / ratio, "ratio": ratio,
            "chose": "async", "reused": reused}


def test_the_baseline_run_comes_first_then_the_fallback_then_the_estimate() -> None:
    fb = {"probes": [_probe(1.5)], "mode": "async"}
    measured = _summary(verdict_source="measured", fallback=fb)
    h = headline(measured, baseline_per_s=95.0)
    assert h is not None and h["source"] == "baseline"
    assert h["ratio"] == 150.0 / 95.0 and h["verdict"] == "paid"
    h = headline(measured)
    assert h is not None and (h["source"], h["ratio"]) == ("measured", 1.5)
    h = headline(_summary())
    assert h is not None and (h["source"], h["ratio"]) == ("estimated", 1.36)
    assert (h["async_per_s"], h["sync_per_s"]) == (150.0, 110.0)


def test_an_earlier_runs_choice_is_said_as_reused_not_measured() -> None:
    fb = {"probes": [_probe(0.94, reused=True)], "mode": "sync"}
    h = headline(_summary(verdict="did not pay", verdict_source="measured", fallback=fb))
    assert h is not None and h["source"] == "reused" and h["verdict"] == "did not pay"
    line = render_headline(h)
    assert line.startswith("asynchrony did not pay: 0.94x sync's accepted rollouts/s")
    assert "an earlier run's sync-fallback windows" in line and "no sync step" in line


def test_a_sync_run_and_a_run_without_a_reading_have_none() -> None:
    assert headline({**_summary(), "max_staleness": 0}) is None
    assert headline({"max_staleness": 1, "overlap": {"ratio": None}}) is None
    assert render_headline(None) == ""


def test_the_summary_block_reads_the_baseline_run_it_names(tmp_path: Path) -> None:
    run, base = tmp_path / "run", tmp_path / "run" / "baseline"
    base.mkdir(parents=True)
    (base / "summary.json").write_text(json.dumps({"accepted_rollouts_per_s": 100.0}))
    (run / "summary.json").write_text(json.dumps({"time_to_reward": {"baseline": "baseline"}}))
    out = write_summary(run, _summary(), host={})
    assert out[ASYNCHRONY]["source"] == "baseline" and out[ASYNCHRONY]["ratio"] == 1.5
    said = json.loads((run / "summary.json").read_text())[ASYNCHRONY]
    assert said["sync_per_s"] == 100.0
    assert render_headline(said) == (
        "asynchrony paid: 1.50x sync's accepted rollouts/s (150.0 vs 100.0/s); source: the "
        "synchronous baseline run of the same work, whole runs")
