"""The report's History section: the run's timeline (:mod:`freshroll.figures.history`):
segments and resumes, setting changes, sync-fallback windows, worker losses and returns,
trainer restarts, controller decisions and injected faults, as a plot and a table."""

from __future__ import annotations

from html import escape

from freshroll.figures.history import LANES, HistoryFold
from freshroll.report import plots
from freshroll.report.markup import fmt, img, table

#: rows of the table shown at most (the first ones; a note counts the rest)
MAX_ROWS = 200


def history_section(history: HistoryFold | None) -> str:
    """The section's HTML; ``history`` None: no readable ledger."""
    if history is None:
        return "<p>No readable ledger: no history.</p>"
    entries = history.entries
    plot = img(plots.timeline(LANES, [(e.t, e.lane) for e in entries],
                              [(c.t, c.workers, c.admission_limit) for c in history.controls]),
               "run history") if entries or history.controls else ""
    rows = [(f"{e.t:.2f}", fmt(e.step), escape(e.lane), escape(e.text))
            for e in entries[:MAX_ROWS]]
    more = (f"<p class='hint'>... and {len(entries) - MAX_ROWS} more entries (the ledger "
            "has them all: freshroll events).</p>" if len(entries) > MAX_ROWS else "")
    routine = history.decisions - sum(1 for e in entries if e.lane == "controller")
    hint = ("<p class='hint'>What happened to the run, in ledger order: seconds since it "
            "opened, the steps committed by then. "
            + (f"{routine} controller decision(s) kept every setting (not listed). "
               if routine else "")
            + "The Config section shows the settings in force at the end.</p>")
    if not entries:
        return hint + plot + ("<p>Nothing happened beyond the steps: no resume, setting "
                              "change, mode switch, worker loss, restart, controller change "
                              "or fault.</p>")
    return hint + plot + table(("s", "step", "lane", "what"), rows) + more


__all__ = ["MAX_ROWS", "history_section"]
