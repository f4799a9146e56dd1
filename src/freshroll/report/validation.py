"""A repeat of ``freshroll validate`` says so in its report: the decision it fed and how this
run measured on each gate (the ``decision.json`` beside its run directory, docs/validate.md)."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from freshroll.report.markup import fmt, table

DECISION_FILE = "decision.json"


def validation_note(run_dir: Path) -> str:
    """The note (empty: the run is no validate repeat, or the record cannot be read)."""
    path = run_dir.parent / DECISION_FILE
    try:
        record: dict[str, Any] = json.loads(path.read_text())
        criteria = list(record["validation"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    mine = run_dir.name
    rows = []
    for c in criteria:
        here = [r.get("value") for r in c.get("per_repeat") or [] if r.get("label") == mine]
        if here:
            rows.append((escape(str(c.get("name"))), escape(str(c.get("threshold", ""))),
                         fmt(here[0]), "pass" if c.get("passed") else "<b>FAIL</b> (all repeats)"))
    if not rows:
        return ""
    head = (f"<p><b>validate</b>: this run is the <code>{escape(mine)}</code> repeat of "
            f"<code>{escape(str(record.get('name', '')))}</code>; decision: "
            f"<b>{escape(str(record.get('recommendation', '')))}</b> "
            f"(<code>{escape(str(path))}</code>).</p>")
    return ('<div class="notes">' + head
            + table(("gate", "threshold", "this repeat", "gate over all repeats"), rows)
            + "</div>")


__all__ = ["DECISION_FILE", "validation_note"]
