"""The end of a run reads its ledger once: summary.json, the verify report and report.html
come from one pass (:mod:`freshroll.runtime.endfiles`), and they equal what the standalone
readers (``freshroll verify``, ``summarize``, ``load_run``) compute on their own."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import load_config
from freshroll.figures.headline import headline
from freshroll.figures.summary import summarize
from freshroll.harness.verify import verify_run
from freshroll.ledger.store import Ledger
from freshroll.runtime import run as run_mod

SIM = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false", "run.steps=4",
       "task.n_prompts=64", "rollout.group_size=4", "rollout.batch_groups=2",
       "rollout.workers=3", "rollout.worker_batch=4"]


class _Reads:
    """Counts the ledger reads (``Ledger.events`` calls) made while ``active``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.active, self.calls = False, 0
        events = Ledger.events

        def counted(ledger: Ledger, after: int = 0) -> Iterator[Any]:
            if self.active:
                self.calls += 1
            return events(ledger, after)

        monkeypatch.setattr(Ledger, "events", counted)

    def during(self, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.active = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.active = False

        return wrapped


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("end") / "run"
    result = run_mod.run(load_config(None, SIM), out, stream=io.StringIO())
    assert result.ok
    return out


def test_the_end_of_a_run_reads_the_ledger_once(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """counts.json, summary.json, verify (its checks of every file included) and report.html:
    one ``Ledger.events`` pass in all (it was six), so the end phase cannot regress silently."""
    reads = _Reads(monkeypatch)
    monkeypatch.setattr(run_mod, "_write_end_files", reads.during(run_mod._write_end_files))
    out = tmp_path / "run"
    result = run_mod.run(load_config(None, SIM), out, stream=io.StringIO())
    assert result.ok
    assert reads.calls == 1
    for name in ("counts.json", "summary.json", "report.html"):
        assert (out / name).is_file()
    html = (out / "report.html").read_text()
    assert "verify: ok" in html and "verify: FAIL" not in html


def test_standalone_readers_read_the_ledger_once(sim_run: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from freshroll.report.html import write_report
    from freshroll.runtime.endfiles import finish_run_dir

    reads = _Reads(monkeypatch)
    for fn, n in ((verify_run, 1), (write_report, 1), (finish_run_dir, 1)):
        reads.calls = 0
        reads.during(fn)(sim_run)
        assert reads.calls == n, fn.__name__
    reads.calls = 0  # with a baseline: its figures only (it is not verified)
    reads.during(write_report)(sim_run, baseline=sim_run, out=sim_run / "cmp.html")
    assert reads.calls == 2


def test_end_products_equal_the_standalone_computations(sim_run: Path) -> None:
    """summary.json is the summary a fresh read computes; the report shows the verdict the
    standalone verify gives; all of it from the single pass."""
    written = json.loads((sim_run / "summary.json").read_text())
    host = written.pop("host")  # the host's load at the end: observed, not from the ledger
    assert set(host) == {"loadavg", "cores", "cpu_count", "placement"}
    # where the run placed its compute: the simulated engine runs inline, nothing probed
    assert host["placement"]["runtime"] == "inline" and host["placement"]["probe"] is None
    said = written.pop("asynchrony")  # the headline: derived from the summary's own figures
    assert said == json.loads(json.dumps(headline(written)))
    assert written == summarize(sim_run)
    report = verify_run(sim_run)
    assert report.ok, report.render()
    html = (sim_run / "report.html").read_text()
    st = report.stats
    assert f"{st['events']:,} events, {st['requests']:,} requests" in html


def test_the_single_pass_still_checks_every_file(sim_run: Path, tmp_path: Path) -> None:
    """A metrics.jsonl row, a summary.json figure or counts.json that disagree with the
    ledger fail the end pass's verify, and the report shows it (nothing checked less)."""
    import shutil

    from freshroll.runtime.endfiles import finish_run_dir

    run = tmp_path / "run"
    shutil.copytree(sim_run, run)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    row = json.loads(lines[1])
    row["accepted_total"] += 1
    lines[1] = json.dumps(row) + "\n"
    (run / "metrics.jsonl").write_text("".join(lines))
    counts = json.loads((run / "counts.json").read_text())
    counts["committed"] += 1
    (run / "counts.json").write_text(json.dumps(counts))
    done = finish_run_dir(run)
    assert not isinstance(done.verified, Exception)
    bad = done.verified.violations["accounting"]
    assert any("row 2 (step 2): accepted_total" in m for m in bad), bad
    assert any(m.startswith("committed: reported") for m in bad), bad
    assert verify_run(run).to_json() == done.verified.to_json()
    html = (run / "report.html").read_text()
    assert "verify: FAIL" in html and "<b>accounting</b>" in html
    # summary.json is rewritten from the ledger by the end pass; a tampered one is caught by
    # the standalone verify
    data = json.loads((run / "summary.json").read_text())
    data["steps"] += 1
    (run / "summary.json").write_text(json.dumps(data))
    assert any("summary.json steps" in m for m in verify_run(run).violations["accounting"])


def test_an_unreadable_counts_json_is_shown_and_raised(sim_run: Path, tmp_path: Path) -> None:
    import shutil

    from freshroll.errors import LedgerError
    from freshroll.runtime.endfiles import finish_run_dir

    run = tmp_path / "run"
    shutil.copytree(sim_run, run)
    (run / "counts.json").write_text("{not json")
    done = finish_run_dir(run)
    assert isinstance(done.verified, LedgerError)
    assert "could not verify" in (run / "report.html").read_text()
    with pytest.raises(LedgerError, match=r"counts\.json"):
        verify_run(run)


def test_fixed_costs_are_recorded_and_survive_a_rebuilt_summary(sim_run: Path,
                                                                 tmp_path: Path) -> None:
    import shutil

    from freshroll.runtime.endfiles import (
        finish_run_dir,
        record_fixed_costs,
        render_fixed_costs,
    )

    run = tmp_path / "run"
    shutil.copytree(sim_run, run)
    summary = json.loads((run / "summary.json").read_text())
    assert "fixed_costs" not in summary  # a virtual-clock run records none
    assert render_fixed_costs(summary) == ""
    fixed = record_fixed_costs(run, summary, (100.0, 110.0), called_at=97.5, now=112.0)
    assert fixed == {"start_s": 2.5, "end_s": 2.0}
    assert json.loads((run / "summary.json").read_text())["fixed_costs"] == fixed
    assert "start-up 2.5 s" in render_fixed_costs(summary)
    assert verify_run(run).ok  # not a ledger figure: verify does not recompute it
    finish_run_dir(run, report=False)  # `freshroll report` rebuilds summary.json
    assert json.loads((run / "summary.json").read_text())["fixed_costs"] == fixed
    # a Ray run's: Ray's own start and stop, inside those seconds (issue 25)
    ray = record_fixed_costs(run, summary, (100.0, 110.0), called_at=90.0, now=114.0,
                             parts={"ray_start_s": 4.25, "ray_stop_s": 2.5})
    assert ray == {"start_s": 10.0, "end_s": 4.0, "ray_start_s": 4.25, "ray_stop_s": 2.5}
    line = render_fixed_costs(summary)
    assert "Ray's own start 4.2 s" in line and "Ray's own stop 2.5 s" in line
