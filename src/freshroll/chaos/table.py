"""The scenario x seed table of a chaos run: one row per scenario (and placement).

=============  ===================================================================
column         meaning
=============  ===================================================================
scenario       the plan's scenario (``[placement]`` when not the simulated cluster)
seeds          cases run (one per seed)
violations     violations over all its seeds (cases with any: ``n/seeds``), and the
               first one's invariant and message
faults         faults recorded / planned, summed over its seeds
recovery s     median and max recovery time (:mod:`freshroll.chaos.recovery`) over
               the seeds that have one; ``never n``: seeds that did not recover
throughput     median and min of accepted rollouts/s under faults over fault-free
outcome        how the runs ended: ``finished n`` / ``stopped n`` (and the first
               stopping error's head)
=============  ===================================================================

Written as ``OUT/chaos.md`` and ``OUT/chaos.json`` (the rows, and every case's
:meth:`~freshroll.chaos.result.CaseResult.to_json`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from freshroll.chaos.result import CaseResult

MD_FILE = "chaos.md"
JSON_FILE = "chaos.json"
COLUMNS = ("scenario", "seeds", "violations", "faults", "recovery s (median / max)",
           "throughput (median / min)", "outcome")


def rows(results: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """One row per (scenario, placement), in the order the cases ran."""
    groups: dict[tuple[str, str], list[CaseResult]] = {}
    for r in results:
        groups.setdefault((r.scenario, r.placement), []).append(r)
    out = []
    for (scenario, placement), cases in groups.items():
        bad = [c for c in cases if c.violations]
        first = bad[0].violations[0] if bad else None
        rec = [c.recovery_s for c in cases if c.recovery_s is not None]
        thr = [c.throughput_ratio for c in cases if c.throughput_ratio is not None]
        stopped = [c.outcome for c in cases if c.outcome != "finished"]
        out.append({
            "scenario": scenario, "placement": placement,
            "seeds": [c.seed for c in cases],
            "violations": sum(len(c.violations) for c in cases),
            "cases_with_violations": len(bad),
            "first_violation": None if first is None else {
                "seed": bad[0].seed, "invariant": first.invariant, "message": first.message},
            "faults_injected": sum(c.faults_injected for c in cases),
            "faults_planned": sum(c.faults_planned for c in cases),
            "recovery_s_median": statistics.median(rec) if rec else None,
            "recovery_s_max": max(rec) if rec else None,
            "never_recovered": len(cases) - len(rec),
            "throughput_median": statistics.median(thr) if thr else None,
            "throughput_min": min(thr) if thr else None,
            "finished": len(cases) - len(stopped),
            "stopped": len(stopped),
            "first_stop": stopped[0] if stopped else None,
        })
    return out


def _num(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _cell(text: str, width: int = 90) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def render_markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in table:
        name = row["scenario"] + ("" if row["placement"] == "sim" else f" [{row['placement']}]")
        n = len(row["seeds"])
        if row["violations"]:
            first = row["first_violation"]
            viol = (f"**{row['violations']}** ({row['cases_with_violations']}/{n} seeds; "
                    f"seed {first['seed']}: {first['invariant']}: {_cell(first['message'])})")
        else:
            viol = "0"
        rec = f"{_num(row['recovery_s_median'])} / {_num(row['recovery_s_max'])}"
        if row["never_recovered"]:
            rec += f" (never {row['never_recovered']})"
        thr = f"{_num(row['throughput_median'], '.2f')} / {_num(row['throughput_min'], '.2f')}"
        outcome = f"finished {row['finished']}" if not row["stopped"] else (
            f"stopped {row['stopped']}" + (f", finished {row['finished']}" if row["finished"]
                                          else "")
            + f" ({_cell(str(row['first_stop']).removeprefix('stopped: '), 60)})")
        lines.append(f"| {name} | {n} | {viol} | {row['faults_injected']}/"
                     f"{row['faults_planned']} | {rec} | {thr} | {outcome} |")
    return "\n".join(lines) + "\n"


def totals(results: Sequence[CaseResult]) -> dict[str, int]:
    return {"cases": len(results), "violations": sum(len(r.violations) for r in results),
            "cases_with_violations": sum(1 for r in results if r.violations)}


def write_tables(results: Sequence[CaseResult], out: Path, *,
                 header: dict[str, Any] | None = None) -> str:
    """Write ``OUT/chaos.md`` and ``OUT/chaos.json``; returns the markdown."""
    table = rows(results)
    t = totals(results)
    md = render_markdown(table)
    head = (f"{t['cases']} cases, {t['violations']} violation(s) in "
            f"{t['cases_with_violations']} case(s)\n\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / MD_FILE).write_text(head + md)
    body = {**(header or {}), "totals": t, "rows": table,
            "cases": [r.to_json() for r in results]}
    (out / JSON_FILE).write_text(json.dumps(body, indent=1, sort_keys=False))
    return head + md


__all__ = ["COLUMNS", "JSON_FILE", "MD_FILE", "render_markdown", "rows", "totals",
           "write_tables"]
