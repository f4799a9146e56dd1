"""The long-tail figures of a bench table, one row per run (issue 26): what each tail lever
costs and what the controller did.

From a run directory (its ``summary.json`` and ledger)::

    stale, cancelled, deadline, other   requests discarded for each reason, as a share of the
                                        requests that reached an outcome (accepted + every
                                        counted discard: not shutdown)
    refreshed                           attempts re-issued by tail.refresh (a retry, not an
                                        outcome: not in the shares above) as a share of every
                                        attempt started (summary.json's refreshed.share), and
                                        the worker-seconds they cost: the run's worker-seconds
                                        (freshroll.bench.figures.worker_seconds) times their
                                        share of the tokens generated (refreshed.token_share)
    length bias                         summary.json's sample_bias.length_bias (cancelled
                                        running members count with a censored length:
                                        freshroll.figures.bias)
    re-balance                          on a workload whose trainer changes speed
                                        (sim.trainer_speed): for each change at step s, the
                                        trainer steps from s to the first decision after it
                                        that changed the worker count ("-": none before the
                                        next change or the end)
    extra max                           the largest extra requests per group admitted
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from freshroll.bench.figures import mean_sd, worker_events, worker_seconds
from freshroll.ledger.store import LEDGER_FILE, Ledger

REASONS = ("stale", "cancelled", "deadline")
#: discard reasons that say nothing about a sample (not counted)
UNCOUNTED = frozenset({"shutdown", "fenced", "refreshed"})


def rebalance_delays(decisions: Sequence[tuple[int, int, int]], changes: Sequence[int]
                     ) -> list[int | None]:
    """``decisions``: (committed steps when decided, workers before, workers after), in order;
    ``changes``: the steps at which the trainer's speed changed. Per change, the steps to the
    first change of the worker count at or after it and before the next change."""
    if not changes:
        return []
    out: list[int | None] = []
    bounds: list[int | None] = [*changes[1:], None]
    for s, end in zip(changes, bounds, strict=True):
        hit = next((step for step, was, now in decisions
                    if step >= s and (end is None or step < end) and was != now), None)
        out.append(None if hit is None else hit - s)
    return out


def _decisions(run_dir: Path) -> tuple[list[tuple[int, int, int]], int]:
    """(steps, workers before, after) of every controller decision; the largest extra."""
    steps, out, extra = 0, [], 0
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        for _seq, kind, body in ledger.rows():
            if kind == "committed":
                steps += 1
            elif kind == "controller_decided":
                d = json.loads(body)
                out.append((steps, d["previous"]["workers"], d["settings"]["workers"]))
            elif kind == "requested":
                r = json.loads(body)
                if r.get("target") is not None:
                    extra = max(extra, r["size"] - r["target"])
    return out, extra


def tail_row(run_dir: Path, label: str, changes: Sequence[int]) -> dict[str, Any]:
    """The module's figures of one finished run."""
    s = json.loads((run_dir / "summary.json").read_text())
    discards: Mapping[str, int] = s.get("discards", {})
    counted = {k: v for k, v in discards.items() if k not in UNCOUNTED}
    total = int(s["accepted_rollouts"]) + sum(counted.values())
    share = {k: (counted.get(k, 0) / total if total else 0.0) for k in REASONS}
    other = sum(v for k, v in counted.items() if k not in REASONS)
    decisions, extra = _decisions(run_dir)
    refreshed = s.get("refreshed") or {}
    tokens = float(refreshed.get("token_share", 0.0))
    return {"run": label, **share, "other": other / total if total else 0.0,
            "refreshed": float(refreshed.get("share", 0.0)),
            "refreshed_worker_s": tokens and tokens * worker_seconds(worker_events(run_dir)),
            "length_bias": (s.get("sample_bias") or {}).get("length_bias"),
            "rebalance": rebalance_delays(decisions, changes),
            "extra_max": extra}


#: the numeric figures of a tail row that several seeds average (mean ± sample sd)
SEED_KEYS = (*REASONS, "other", "refreshed", "refreshed_worker_s", "length_bias")


def aggregate_tails(per_seed: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One tail row per run over several seeds (seed -> its :func:`tail_row` of each run, in
    the same order): each of :data:`SEED_KEYS` the mean (``sd``: the sample sd; a length
    bias no seed has stays ``None``), ``rebalance`` per speed change the delay of each seed,
    ``extra_max`` the largest over the seeds, ``per_seed`` each seed's own row."""
    seeds = list(per_seed)
    out = []
    for i, first in enumerate(per_seed[seeds[0]] if seeds else []):
        rows = [per_seed[s][i] for s in seeds]
        if any(r["run"] != first["run"] for r in rows):
            raise ValueError(f"tail rows of {first['run']!r} differ in order between seeds")
        stats = {k: mean_sd(r[k] for r in rows if r[k] is not None) for k in SEED_KEYS}
        row: dict[str, Any] = {"run": first["run"], **{k: m for k, (m, _) in stats.items()},
                               "sd": {k: sd for k, (_, sd) in stats.items()}}
        if all(r["length_bias"] is None for r in rows):
            row["length_bias"] = None
        row["rebalance"] = [list(ds) for ds in zip(*(r["rebalance"] for r in rows),
                                                   strict=True)]
        row["extra_max"] = max(r["extra_max"] for r in rows)
        row["seeds"] = len(rows)
        row["per_seed"] = [{"seed": s, **r} for s, r in zip(seeds, rows, strict=True)]
        out.append(row)
    return out


def _pm(r: Mapping[str, Any], key: str, spec: str) -> str:
    """``r[key]`` in ``spec``, with ``± sd`` where the row averages seeds."""
    value = r[key]
    text = format(value, spec)
    sd = (r.get("sd") or {}).get(key, math.nan)
    if r.get("seeds", 1) > 1 and sd is not None and math.isfinite(sd):
        text += f" ± {format(sd, spec.lstrip('+'))}"
    return text


def _delay(d: Any) -> str:
    if isinstance(d, list):  # one delay per seed
        return "/".join(_delay(x) for x in d)
    return "-" if d is None else str(d)


def _cells(r: Mapping[str, Any]) -> list[str]:
    bias = r["length_bias"]
    rebalance = ", ".join(_delay(d) for d in r["rebalance"]) or "n/a"
    refreshed = f"{_pm(r, 'refreshed', '.1%')} ({r['refreshed_worker_s']:.0f} s)"
    return [r["run"], *(_pm(r, k, ".1%") for k in (*REASONS, "other")), refreshed,
            "-" if bias is None or not math.isfinite(bias) else _pm(r, "length_bias", "+.3f"),
            rebalance, str(r["extra_max"])]


HEAD = ["run", "stale", "cancelled", "deadline", "other", "refreshed (worker-s)",
        "length bias", "re-balance (steps)", "extra max"]


def _seeded(rows: Sequence[Mapping[str, Any]]) -> bool:
    return any(r.get("seeds", 1) > 1 for r in rows)


def render_text(rows: Sequence[Mapping[str, Any]]) -> str:
    body = [_cells(r) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(HEAD, *body, strict=True)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
             for cells in [HEAD, *body]]
    return ("discards by reason, refreshed attempts, length bias, re-balance delay"
            + (" (several seeds: mean ± sd; re-balance per seed)" if _seeded(rows) else "")
            + ":\n"
            + "\n".join(lines) + "\n")


def render_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["Discards by reason, refreshed attempts, length bias, re-balance delay"
             + (" (several seeds: mean ± sd; re-balance per seed)" if _seeded(rows) else "")
             + ":", "",
             "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n\n"


__all__ = ["HEAD", "REASONS", "SEED_KEYS", "aggregate_tails", "rebalance_delays",
           "render_markdown", "render_text", "tail_row"]
