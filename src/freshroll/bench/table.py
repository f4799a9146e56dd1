"""Rendering of a bench table: plain text for the terminal, markdown and JSON for the out dir.

A table is a plain mapping (:func:`make_table`): the workload's name and clock, the
stage capacities with their per-batch times and the async bound, one row per run
(:func:`freshroll.bench.figures.table_rows`), and the verdict line; and on a simulated
workload the long-tail figures of each run (:mod:`freshroll.bench.tails`). Renderers only
format; every number comes from :mod:`freshroll.bench.figures`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from freshroll.bench import figures as f
from freshroll.bench import tails

#: (key, header, format) of each column, in order
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run", "run", ""),
    ("accepted_per_s", "accepted/s", ".1f"),
    ("E", "E", ".2f"),
    ("window_bound", "window bound", ".2f"),
    ("speedup", "speedup", ".2f"),
    ("A", "A", ".2f"),
    ("reward_s_ratio", "t-reward vs sync", ".2f"),
    ("trainer_idle", "idle", ".1%"),
    ("discard_rate", "discard", ".1%"),
    ("lag", "lag p50/p99/max", ""),
    ("worker_s", "worker-s", ".0f"),
    ("verify", "verify", ""),
)


def make_table(workload: str, clock: str, caps: f.Capacities,
               rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The table as data (what the JSON file holds)."""
    runs = [r for r in rows if r["run"] != "sync"]
    pays = f.async_pays(r["speedup"] for r in runs)
    best = max(runs, key=lambda r: _finite(r["speedup"]), default=None)
    return {
        "workload": workload, "clock": clock,
        "capacities_per_s": caps.per_s(), "stage_times_s": f.stage_times(caps),
        "batch": caps.batch, "binding_stage": f.binding_stage(caps),
        "bound": f.async_bound(caps), "rows": [dict(r) for r in rows],
        "async_pays": pays, "best": best["run"] if best else None,
        "verdict": verdict_line(pays, best),
    }


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -math.inf


def verdict_line(pays: bool, best: Mapping[str, Any] | None) -> str:
    """The plain line under the table."""
    if best is None:
        return "no asynchronous run in this table."
    s = f"best: {best['run']} at {_fmt(best['speedup'], '.2f')}x the synchronous baseline"
    if pays:
        return s + "."
    return (s + f": asynchrony does not pay on this workload (speedup < {f.PAYS_AT}): "
            "one stage dominates, or the stages share the same cores.")


def _fmt(value: Any, spec: str) -> str:
    if isinstance(value, bool):
        return "ok" if value else "FAILED"
    if isinstance(value, int | float):
        return format(value, spec) if math.isfinite(value) else "-"
    return str(value)


#: a table over several seeds adds these columns (mean over the seeds' runs)
SEED_COLUMNS: tuple[tuple[str, str, str], ...] = (("seeds", "seeds", "d"), ("load", "load", ".1f"))


def _seeded(t: Mapping[str, Any]) -> bool:
    return bool(t.get("seeds"))


def _head(t: Mapping[str, Any]) -> list[str]:
    return [h for _, h, _ in (*COLUMNS, *(SEED_COLUMNS if _seeded(t) else ()))]


def _pm(row: Mapping[str, Any], key: str, spec: str) -> str:
    """The cell of ``key``: its value, with ``± sd`` where the row averages several seeds."""
    text = _fmt(row.get(key, math.nan), spec)
    sd = (row.get("sd") or {}).get(key, math.nan)
    several = row.get("seeds", 1) > 1 and text != "-"
    if several and isinstance(sd, int | float) and math.isfinite(sd):
        text += f" ± {format(sd, spec)}"
    return text


def _cells(row: Mapping[str, Any], seeded: bool = False) -> list[str]:
    out = []
    for key, _, spec in COLUMNS:
        if key == "lag":
            lag = "{:.0f}/{:.0f}/{:.0f}" if row.get("seeds", 1) == 1 else "{:.1f}/{:.1f}/{:.1f}"
            out.append(lag.format(row["lag_p50"], row["lag_p99"], row["lag_max"]))
        elif key == "verify" and row.get("seeds", 1) > 1 and not row["verify"]:
            bad = sum(not r["verify"] for r in row.get("per_seed", ()))
            out.append(f"FAILED ({bad} of {row['seeds']})")
        elif key in ("run", "verify"):
            out.append(_fmt(row.get(key, math.nan), spec))
        else:
            out.append(_pm(row, key, spec))
    if seeded:
        out += [_fmt(row.get(key, math.nan), spec) for key, _, spec in SEED_COLUMNS]
    return out


def _caps_line(t: Mapping[str, Any]) -> str:
    caps, times = t["capacities_per_s"], t["stage_times_s"]
    parts = [f"{s} {_fmt(caps[s], '.1f')}/s ({_fmt(times[s], '.3g')} s/batch)" for s in f.STAGES]
    return (f"stage capacities (samples/s, B={t['batch']}): " + ", ".join(parts)
            + f"; binding: {t['binding_stage']}; async bound {_fmt(t['bound'], '.2f')}x"
            + (f" (measured once, at the config's seed {t['capacity_seed']})"
               if _seeded(t) and "capacity_seed" in t else ""))


def _seeds_line(t: Mapping[str, Any]) -> str:
    """Under a table over several seeds: what its cells are, and its wall and load."""
    if not _seeded(t):
        return ""
    seeds = " ".join(str(s) for s in t["seeds"])
    line = (f"seeds {seeds}: each cell the mean ± sample sd over the seeds (each seed's speedup, "
            "A and t-reward against its own sync); verify ok only if every seed's run verified; "
            "load: the 1-minute load average after each run, mean over the seeds.")
    if "wall_s" in t:
        line += (f" {t['runs']} runs in {t['wall_s']:.0f} s wall, load average "
                 f"{t['load_start']:.2f} -> {t['load_end']:.2f}.")
    return line + "\n"


def _title(t: Mapping[str, Any]) -> str:
    extra = [f"{t['steps']} steps"] if "steps" in t else []
    if _seeded(t):
        extra.append(f"{len(t['seeds'])} seeds")
    if t.get("time_scale") not in (None, 1.0):
        extra.append(f"sim.time_scale {t['time_scale']:.4g}")
    return f"{t['workload']} ({t['clock']} clock{', ' if extra else ''}{', '.join(extra)})"


def render_text(t: Mapping[str, Any]) -> str:
    """A fixed-width table for the terminal."""
    head = _head(t)
    body = [_cells(r, _seeded(t)) for r in t["rows"]]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    line = "  ".join

    def fmt(cells: list[str]) -> str:
        return line(c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    text = "\n".join([f"== {_title(t)}", _caps_line(t), fmt(head),
                      *(fmt(b) for b in body), t["verdict"]]) + "\n" + _seeds_line(t)
    return text + (tails.render_text(t["tails"]) if t.get("tails") else "")


def render_markdown(t: Mapping[str, Any]) -> str:
    head = _head(t)
    rows = [_cells(r, _seeded(t)) for r in t["rows"]]
    lines = [f"### {_title(t)}", "", _caps_line(t), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join([*lines, "", t["verdict"], ""]) + "\n"
    if _seeded(t):
        text += _seeds_line(t) + "\n"
    return text + (tails.render_markdown(t["tails"]) if t.get("tails") else "")


def render_json(tables: Sequence[Mapping[str, Any]]) -> str:
    from freshroll.figures.metrics import jsonable

    return json.dumps(jsonable(list(tables)), indent=1, sort_keys=False) + "\n"


__all__ = ["COLUMNS", "make_table", "render_json", "render_markdown", "render_text",
           "verdict_line"]
