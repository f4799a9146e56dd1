"""Loading a run directory for the report: every input optional, every problem noted.

:func:`load_run` reads ``metrics.jsonl``, ``summary.json``, ``counts.json``,
``config.yaml`` and the ledger (stage spans; the figures of :mod:`freshroll.metrics`
and the per-step rows they imply, the same rows ``metrics.jsonl`` holds). A
missing, empty or broken input never raises: it is left empty and a human-readable
note says what was wrong, so a report can still be written for a run that crashed early.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshroll import events as ev
from freshroll.ledger import LEDGER_FILE, Ledger
from freshroll.metrics import Tally, summary_figures
from freshroll.runtime.metrics_log import read_rows
from freshroll.timing import Spans, StageRow, collect_spans, decompose


@dataclass
class LedgerView:
    spans: Spans
    stages: list[StageRow]
    tally: Tally  # every figure of freshroll.metrics is a function of it
    rows: list[dict[str, Any]]  # one per committed step (metrics.row), in order
    requests: int
    closed: bool

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


def _requests_closed(events: Iterable[ev.Event]) -> tuple[int, bool]:
    """How many requests were admitted, and whether the ledger ends closed."""
    requests, closed = 0, False
    for e in events:
        if isinstance(e, ev.Opened):
            closed = False
        elif isinstance(e, ev.Requested):
            requests += e.size
        elif isinstance(e, ev.Closed):
            closed = True
    return requests, closed


def _read_ledger(path: Path, notes: list[str]) -> LedgerView | None:
    if not path.is_file():
        notes.append(f"{path.name} is missing")
        return None
    try:
        with Ledger(path, readonly=True) as ledger:
            events = [e for _, e in ledger.events()]
        spans = collect_spans(events)
    except Exception as exc:  # any unreadable ledger: the report still renders
        notes.append(f"{path.name} is unreadable: {exc}")
        return None
    tally = Tally()
    rows = [r for e in events if (r := tally.feed(e)) is not None]
    requests, closed = _requests_closed(events)
    return LedgerView(spans, decompose(spans), tally, rows, requests, closed)


def load_run(run_dir: Path) -> RunData:
    """Everything the report needs from one run directory; never raises for bad inputs."""
    run = RunData(Path(run_dir))
    run.summary = _read_json(run.run_dir / "summary.json", run.notes)
    run.metrics = _read_metrics(run.run_dir / "metrics.jsonl", run.notes)
    cfg = run.run_dir / "config.yaml"
    if cfg.is_file():
        run.config_text = cfg.read_text(errors="replace")
    else:
        run.notes.append("config.yaml is missing")
    run.ledger = _read_ledger(run.run_dir / LEDGER_FILE, run.notes)
    mode = run.summary.get("mode")
    run.label = str(mode) if mode else run.run_dir.name
    return run


