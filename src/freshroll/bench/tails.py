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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from freshroll.bench.figures import worker_events, worker_seconds
from freshroll.ledger import LEDGER_FILE, Ledger

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


def _cells(r: Mapping[str, Any]) -> list[str]:
    bias = r["length_bias"]
    rebalance = ", ".join("-" if d is None else str(d) for d in r["rebalance"]) or "n/a"
    return [r["run"], *(f"{r[k]:.1%}" for k in (*REASONS, "other")),
            f"{r['refreshed']:.1%} ({r['refreshed_worker_s']:.0f} s)",
            "-" if bias is None else f"{bias:+.3f}", rebalance, str(r["extra_max"])]


HEAD = ["run", "stale", "cancelled", "deadline", "other", "refreshed (worker-s)",
        "length bias", "re-balance (steps)", "extra max"]


def render_text(rows: Sequence[Mapping[str, Any]]) -> str:
    body = [_cells(r) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(HEAD, *body, strict=True)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
             for cells in [HEAD, *body]]
    return ("discards by reason, refreshed attempts, length bias, re-balance delay:\n"
            + "\n".join(lines) + "\n")


def render_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["Discards by reason, refreshed attempts, length bias, re-balance delay:", "",
             "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n\n"


__all__ = ["HEAD", "REASONS", "rebalance_delays", "render_markdown", "render_text",
           "tail_row"]
