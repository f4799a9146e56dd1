"""The report's Summary section: ``summary.json`` as one collapsible table per block.

A run's ``summary.json`` flattens to 100-200 figures; shown as one table they were half the
report (issue 48). Here each top-level block (``overlap``, ``fixed_costs``, ``host``, ...) is a
``<details>`` element, closed, titled with its name and how many figures it holds, so the
section reads as an index of the blocks; the plain top-level figures (``mode``,
``accepted_rollouts_per_s``, ...) form the first block, open. Nested blocks are dotted keys
down to a block of plain values, shown on one line; a table that has a section of its own is
counted here and named there. With a baseline, each table has a column per run.
"""

from __future__ import annotations

from html import escape
from typing import Any

from freshroll.report.markup import fmt
from freshroll.report.markup import table as _table
from freshroll.report.rundata import RunData

#: summary.json's tables that have a section of their own (shown there, counted here)
_TABLES = {"stages": "Time per stage", "segments": "the header", "over_time": "Discards",
           "levels": "Reward"}
#: the block of the top-level plain figures
TOP = "run"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested blocks as dotted keys, down to a block of plain values (shown on one line)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and any(isinstance(x, dict | list) for x in v.values()):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def readable(key: str, value: Any) -> str:
    """A summary value as a person reads it: numbers short, a block of plain values on one
    line (``0: 104 · 1: 87``), a table counted with the section that shows it."""
    if isinstance(value, dict):
        if not value:
            return "—"
        return " · ".join(f"{escape(str(k))}: {fmt(v)}" for k, v in value.items())
    if isinstance(value, list):
        if not value:
            return "—"
        if all(not isinstance(x, dict | list) for x in value):
            return ", ".join(fmt(x) for x in value)
        where = _TABLES.get(key.rpartition(".")[2])
        return f"{len(value)} rows" + (f" (shown in {where})" if where else "")
    return fmt(value)


def blocks(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``summary`` (its ``config`` left out) as {block: {dotted key: value}}: the top-level
    plain figures under :data:`TOP` first, then each nested block in the file's order."""
    out: dict[str, dict[str, Any]] = {TOP: {}}
    for key, value in flatten({k: v for k, v in summary.items() if k != "config"}).items():
        head, dot, _ = key.partition(".")
        out.setdefault(head if dot else TOP, {})[key] = value
    return {k: v for k, v in out.items() if v}


def summary_section(run: RunData, baseline: RunData | None, nodata: str) -> str:
    """The section's HTML; ``nodata`` when the run has no summary figures."""
    mine = blocks(run.summary)
    if not mine:
        return nodata
    theirs = blocks(baseline.summary) if baseline is not None else {}
    n = sum(len(v) for v in mine.values())
    parts = [f"<p class='hint'>summary.json: {n} figures in {len(mine)} blocks, one "
             "figure per row (docs/metrics.md); open a block to read it.</p>"]
    for name in dict.fromkeys([*mine, *theirs]):
        a, b = mine.get(name, {}), theirs.get(name, {})
        keys = list(dict.fromkeys([*a, *b]))
        if baseline is None:
            rows: list[tuple[str, ...]] = [(f"<code>{escape(k)}</code>", readable(k, a.get(k)))
                                           for k in keys]
            head: tuple[str, ...] = ("figure", "value")
        else:
            rows = [(f"<code>{escape(k)}</code>", readable(k, a.get(k)), readable(k, b.get(k)))
                    for k in keys]
            head = ("figure", run.label, baseline.label)
        opened = " open" if name == TOP else ""
        parts.append(f"<details class='block'{opened}><summary><code>{escape(name)}</code> "
                     f"({len(keys)} figure{'s' if len(keys) != 1 else ''})</summary>"
                     f"{_table(head, rows, 'kv')}</details>")
    return "".join(parts)


__all__ = ["TOP", "blocks", "flatten", "readable", "summary_section"]
