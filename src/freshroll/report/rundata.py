"""Loading a run directory for the report: every input optional, every problem noted.

:func:`load_run` reads ``metrics.jsonl``, ``summary.json``, ``counts.json``,
``config.yaml`` and the ledger (stage spans, rates, lags, per-step wait and
throughput points). A missing, empty or broken input never raises: it is left
empty and a human-readable note says what was wrong, so a report can still be
written for a run that crashed early.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshroll import events as ev
from freshroll.ledger import LEDGER_FILE, Ledger
from freshroll.runtime.summary import read_metrics
from freshroll.timing import RunRates, Spans, StageRow, collect_spans, decompose, run_rates


@dataclass
class StepPoint:
    """One committed trainer step as seen in the ledger."""

    t: float  # seconds since the first ``opened``
    samples: int
    interval: float  # seconds since the previous commit (or this incarnation's ``opened``)
    wait_s: float
    cum_accepted: int
    cum_wait: float


@dataclass
class LedgerView:
    spans: Spans
    stages: list[StageRow]
    rates: RunRates
    steps: list[StepPoint]
    max_staleness: int | None
    requests: int
    closed: bool


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
    rows, bad = read_metrics(path)
    if bad:
        notes.append(f"{path.name}: skipped {bad} unparsable line(s)")
    if not rows:
        notes.append(f"{path.name} has no rows")
    return rows


def _ledger_steps(events: Iterable[ev.Event]) -> tuple[list[StepPoint], int | None, int, bool]:
    """Per-commit points, the max_staleness in force, request count and whether closed."""
    t0: float | None = None
    prev: float | None = None
    waits: dict[str, float] = {}
    points: list[StepPoint] = []
    eta: int | None = None
    requests = accepted = 0
    cum_wait = 0.0
    closed = False
    for e in events:
        if isinstance(e, ev.Opened):
            t0 = e.ts if t0 is None else t0
            prev, eta, closed = e.ts, e.max_staleness, False
        elif isinstance(e, ev.Requested):
            requests += e.size
        elif isinstance(e, ev.Leased):
            waits[e.lease] = e.wait_s
        elif isinstance(e, ev.Committed):
            base = t0 if t0 is not None else e.ts
            wait = waits.pop(e.lease, 0.0)
            accepted += len(e.samples)
            cum_wait += wait
            interval = e.ts - prev if prev is not None else 0.0
            points.append(StepPoint(e.ts - base, len(e.samples), interval, wait, accepted,
                                    cum_wait))
            prev = e.ts
        elif isinstance(e, ev.Closed):
            closed = True
    return points, eta, requests, closed


def _read_ledger(path: Path, notes: list[str]) -> LedgerView | None:
    if not path.is_file():
        notes.append(f"{path.name} is missing")
        return None
    try:
        with Ledger(path, readonly=True) as ledger:
            spans = collect_spans(e for _, e in ledger.events())
            rates = run_rates(e for _, e in ledger.events())
            steps, eta, requests, closed = _ledger_steps(e for _, e in ledger.events())
    except Exception as exc:  # any unreadable ledger: the report still renders
        notes.append(f"{path.name} is unreadable: {exc}")
        return None
    return LedgerView(spans, decompose(spans), rates, steps, eta, requests, closed)


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


