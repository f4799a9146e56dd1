"""Loading a run directory for the report: every input optional, every problem noted.

:func:`load_run` reads ``metrics.jsonl``, ``summary.json``, ``counts.json``,
``config.yaml`` and the ledger (stage spans; the figures of :mod:`freshroll.figures.metrics`
and the per-step rows they imply, the same rows ``metrics.jsonl`` holds), and verifies the
run directory in the same read of the ledger. A missing, empty or broken input never raises:
it is left empty and a human-readable note says what was wrong, so a report can still be
written for a run that crashed early.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshroll.figures.history import HistoryFold
from freshroll.figures.metrics import Tally, summary_figures
from freshroll.figures.metrics_log import read_rows
from freshroll.figures.summary import SummaryFold, fold_events
from freshroll.figures.timing import Spans, StageRow
from freshroll.figures.trained import StepPicks
from freshroll.harness.verify import Report, check_files, check_ledger, read_counts
from freshroll.ledger.store import LEDGER_FILE, Ledger


@dataclass
class LedgerView:
    spans: Spans
    stages: list[StageRow]
    tally: Tally  # every figure of freshroll.figures.metrics is a function of it
    rows: list[dict[str, Any]]  # one per committed step (metrics.row), in order
    requests: int
    closed: bool
    history: HistoryFold = field(default_factory=HistoryFold)  # the run's timeline
    trained: list[StepPicks] = field(default_factory=list)  # kept samples per step

    @property
    def figures(self) -> dict[str, Any]:
        """The summary figures (same layout as ``summary.json``), from the ledger."""
        return summary_figures(self.tally)


@dataclass
class RunData:
    run_dir: Path
    label: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config_text: str | None = None
    ledger: LedgerView | None = None
    #: ``verify``'s report of the run directory, or the error that kept it from running
    #: (None: not verified)
    verified: Report | Exception | None = None
    notes: list[str] = field(default_factory=list)  # what could not be read, and why


def _read_json(path: Path, notes: list[str]) -> dict[str, Any]:
    if not path.is_file():
        notes.append(f"{path.name} is missing")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name} is unreadable: {exc}")
        return {}
    if not isinstance(data, dict):
        notes.append(f"{path.name} is not a JSON object")
        return {}
    return data


def _read_metrics(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """Parse metrics.jsonl, noting a missing file, skipped broken lines and no rows."""
    if not path.is_file():
        notes.append(f"{path.name} is missing")
        return []
    rows, bad = read_rows(path)
    if bad:
        notes.append(f"{path.name}: skipped {bad} unparsable line(s)")
    if not rows:
        notes.append(f"{path.name} has no rows")
    return rows


def _view(fold: SummaryFold, notes: list[str]) -> LedgerView | None:
    """The report's ledger figures from a fold of the whole ledger (None, noted, when the
    ledger is damaged so that they cannot be computed)."""
    try:
        return LedgerView(fold.spans.result(), fold.stages(), fold.tally, fold.rows,
                          fold.requests, fold.closed, fold.history, fold.trained.steps)
    except Exception as exc:  # a damaged ledger: the report still renders
        notes.append(f"{LEDGER_FILE} is unreadable: {exc}")
        return None


def _read_ledger(run_dir: Path, notes: list[str], verify: bool) -> tuple[
    LedgerView | None, Report | Exception | None
]:
    """One read of the ledger: the report's figures and, if ``verify``, the verify report
    (or the error that kept verify from running)."""
    path = run_dir / LEDGER_FILE
    if not path.is_file():
        notes.append(f"{path.name} is missing")
        if not verify:
            return None, None
    counts: dict[str, int] | None = None
    verified: Report | Exception | None = None
    if verify:
        try:
            counts = read_counts(run_dir / "counts.json")
        except Exception as exc:  # verify fails; the figures are still drawn
            verified = exc
    try:
        if verify:
            passed = check_ledger(run_dir)
            fold = passed.fold
        else:
            with Ledger(path, readonly=True) as ledger:
                fold = fold_events((e for _, e in ledger.events()), ledger.payload)
    except Exception as exc:  # any unreadable ledger: the report still renders
        if path.is_file():
            notes.append(f"{path.name} is unreadable: {exc}")
        return None, verified or exc
    if verify and verified is None:
        try:
            verified = check_files(run_dir, passed, counts)
        except Exception as exc:
            verified = exc
    return _view(fold, notes), verified


def load_run(
    run_dir: Path, *, verify: bool = True, fold: SummaryFold | None = None,
    verified: Report | Exception | None = None,
) -> RunData:
    """Everything the report needs from one run directory; never raises for bad inputs.

    The ledger is read once, for its figures and (``verify``) the ``verify`` report of the
    run directory (:func:`freshroll.harness.verify.verify_run`'s checks). A caller that has
    just read it (the end of a run) passes its ``fold`` and ``verified`` instead: then the
    ledger is not read again.
    """
    run = RunData(Path(run_dir))
    run.summary = _read_json(run.run_dir / "summary.json", run.notes)
    run.metrics = _read_metrics(run.run_dir / "metrics.jsonl", run.notes)
    cfg = run.run_dir / "config.yaml"
    if cfg.is_file():
        run.config_text = cfg.read_text(errors="replace")
    else:
        run.notes.append("config.yaml is missing")
    if fold is not None:
        run.ledger, run.verified = _view(fold, run.notes), verified
    else:
        run.ledger, run.verified = _read_ledger(run.run_dir, run.notes, verify)
    mode = run.summary.get("mode")
    engine = run.summary.get("engine")
    run.label = str(mode) if mode else run.run_dir.name
    if mode and isinstance(engine, str) and engine != "hf":  # e.g. "async (vllm)"
        run.label = f"{mode} ({engine})"
    return run
