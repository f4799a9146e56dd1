"""Did asynchrony pay? One answer per run, with the measurement it comes from named.

A run has up to three readings of the same question, and they differ (issue 48: a demo's
report said 1.50x, the baseline's own rates 1.58x, ``overlap.ratio`` 1.36): the sync
baseline run beside it, the sync fallback's windows inside it, and the estimate from its
stages' overlap. The headline is the most direct one the run has, in this order::

    baseline    a synchronous run of the same work (``--baseline``): the run's accepted
                rollouts/s over the baseline's, both over their whole measured wall
    measured    this run's sync fallback: its last probe's async window over its sync
                window, under this run's load
    reused      the sync fallback's choice taken from an earlier run of the same work at a
                like load (no sync step of this run measured it): said as such, with when
    estimated   the overlap estimate (:mod:`freshroll.figures.overlap`): the run's rate over
                what a sync run would make at the speeds its stages ran alone

``verdict`` is "paid" above 1 + :data:`~freshroll.figures.overlap.PAY_MARGIN` and "did not
pay" otherwise, whatever the source (the fallback's own choice keeps its margin; a choice
made for learning is the learning line's, not this one's). Pure: a ``summary.json`` in, a
block out (``summary.json`` ``asynchrony``, written beside the others; the end lines and the
report's header card read it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from freshroll.figures.overlap import PAY_MARGIN

SOURCES = ("baseline", "measured", "reused", "estimated")
_SAYS = {
    "baseline": "the synchronous baseline run of the same work, whole runs",
    "measured": "this run's sync-fallback windows, under its own load",
    "reused": "an earlier run's sync-fallback windows (same work, like load); no sync step "
              "of this run measured it",
    "estimated": "estimated from the stages' overlap; no sync step measured it",
}


def headline(summary: Mapping[str, Any], baseline_per_s: float | None = None
             ) -> dict[str, Any] | None:
    """The ``asynchrony`` block of ``summary`` (module doc); None for a sync run or one
    without any reading. ``baseline_per_s``: the baseline run's accepted rollouts/s."""
    overlap = summary.get("overlap")
    if not isinstance(overlap, Mapping) or not summary.get("max_staleness"):
        return None
    rate = _number(summary.get("accepted_rollouts_per_s"))
    if rate is not None and baseline_per_s is not None and baseline_per_s > 0:
        return _block("baseline", rate / baseline_per_s, rate, baseline_per_s)
    fb = overlap.get("fallback")
    probes = fb.get("probes") if isinstance(fb, Mapping) else None
    if overlap.get("verdict_source") == "measured" and probes:
        last = probes[-1]
        ratio = _number(last.get("ratio"))
        if ratio is not None:
            source = "reused" if last.get("reused") else "measured"
            return _block(source, ratio, _number(last.get("async_per_s")),
                          _number(last.get("sync_per_s")))
    ratio = _number(overlap.get("ratio"))
    if ratio is None:
        return None
    return _block("estimated", ratio, rate, _number(overlap.get("sync_estimate_per_s")))


def _block(source: str, ratio: float, async_per_s: float | None,
           sync_per_s: float | None) -> dict[str, Any]:
    return {"verdict": "paid" if ratio > 1 + PAY_MARGIN else "did not pay", "ratio": ratio,
            "source": source, "async_per_s": async_per_s, "sync_per_s": sync_per_s}


def render_headline(block: Any) -> str:
    """The block as one line: ``asynchrony paid: 1.58x sync's accepted rollouts/s (...);
    source: the synchronous baseline run of the same work, whole runs``; empty without one."""
    if not isinstance(block, Mapping) or block.get("source") not in SOURCES:
        return ""
    says = _SAYS[block["source"]]
    rates = ""
    a, s = block.get("async_per_s"), block.get("sync_per_s")
    if isinstance(a, int | float) and isinstance(s, int | float):
        rates = f" ({a:.1f} vs {s:.1f}/s)"
    return (f"asynchrony {block['verdict']}: {block['ratio']:.2f}x sync's accepted "
            f"rollouts/s{rates}; source: {says}")


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


__all__ = ["SOURCES", "headline", "render_headline"]
