"""A run segment by segment: each start and each ``--resume`` (an ``opened`` event) begins
one, so a run that fell back to sync and was then resumed async says both, not one muddle.

A segment's figures are those of :mod:`freshroll.figures.metrics` (and the overlap verdict of
:mod:`freshroll.figures.overlap`) over that segment's events alone: a fresh
:class:`~freshroll.figures.metrics.Tally` and :class:`~freshroll.figures.overlap.OverlapFold` per
segment. ``from_step`` is the number of steps committed before it (a resume goes on from
its checkpoint and replays the rest from the ledger without committing them again), so
``to_step = from_step + steps``; ``stopped`` is the reason of its ``closed`` event (None: a
process that was killed, or is still running).

The first segment is the whole run until a second ``opened`` arrives, so a run never
resumed pays nothing for this fold: its segment is read off the whole run's folds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from freshroll.figures.metrics import (
    Tally,
    accepted_rollouts,
    accepted_rollouts_per_s,
    discard_rate,
    mode,
    reward_first,
    reward_last,
    trainer_idle_ratio,
    wall_s,
    worker_losses,
)
from freshroll.figures.overlap import OverlapFold
from freshroll.ledger import events as ev

#: the figures of :mod:`freshroll.figures.metrics` each segment reports, by name
SEGMENT_FIGURES: dict[str, Callable[[Tally], Any]] = {
    "wall_s": wall_s, "accepted_rollouts": accepted_rollouts,
    "accepted_rollouts_per_s": accepted_rollouts_per_s,
    "trainer_idle_ratio": trainer_idle_ratio, "discard_rate": discard_rate,
    "reward_first": reward_first, "reward_last": reward_last, "worker_losses": worker_losses,
}
#: the overlap block's keys kept per segment (the verdict and what it rests on)
OVERLAP_KEYS = ("verdict", "verdict_source", "ratio", "accepted_rollouts_per_s",
                "sync_estimate_per_s", "overlapped", "parallelism", "fallback")


@dataclass
class _Open:
    """The segment being folded (from the second one on: the first is the whole run's)."""

    from_step: int
    tally: Tally = field(default_factory=Tally)
    overlap: OverlapFold = field(default_factory=OverlapFold)


class SegmentFold:
    """``feed`` every event BEFORE the whole run's ``tally`` and ``overlap`` folds see it (a
    :class:`~freshroll.figures.fold.Fold` of every event kind)."""

    KINDS: ClassVar = ev.EVENT_TYPES

    def __init__(self, tally: Tally, overlap: OverlapFold) -> None:
        self._whole = (tally, overlap)
        self._opened = 0
        self._done: list[dict[str, Any]] = []
        self._open: _Open | None = None  # None: the first segment, read off the whole run
        self._stopped: str | None = None  # the open segment's closed reason

    def feed(self, e: Any) -> None:
        if isinstance(e, ev.Opened):
            self._opened += 1
            if self._opened > 1:
                self._done.append(self._segment())
                self._open = _Open(from_step=self._whole[0].steps)
                self._stopped = None
        elif isinstance(e, ev.Closed):
            self._stopped = e.reason
        if self._open is not None:
            self._open.tally.feed(e)
            if isinstance(e, OverlapFold.KINDS):
                self._open.overlap.feed(e)

    def _segment(self) -> dict[str, Any]:
        tally, overlap = (self._open.tally, self._open.overlap) if self._open else self._whole
        from_step = self._open.from_step if self._open else 0
        o = overlap.result(tally)
        return {
            "segment": len(self._done) + 1, "from_step": from_step,
            "to_step": from_step + tally.steps, "steps": tally.steps,
            "mode": mode(tally), "max_staleness": tally.max_staleness,
            **{name: fn(tally) for name, fn in SEGMENT_FIGURES.items()},
            "overlap": {k: o.get(k) for k in OVERLAP_KEYS},
            "stopped": self._stopped,
        }

    def result(self) -> list[dict[str, Any]]:
        """Every segment so far, the open one last (none before the first ``opened``)."""
        return [*self._done, self._segment()] if self._opened else []


def render_segments(segments: list[dict[str, Any]]) -> str:
    """The end's lines for a run of more than one segment (empty for one): one per segment
    that trained, with its own rate, idle, reward and verdict."""
    if len(segments) < 2:
        return ""
    lines = [f"this run in {len(segments)} segments (a start and {len(segments) - 1} "
             f"resume{'s' if len(segments) > 2 else ''}):"]
    for s in segments:
        span = (f"steps {s['from_step'] + 1}-{s['to_step']}" if s["steps"]
                else f"no steps after step {s['from_step']}")
        eta = s["max_staleness"]
        how = "sync" if eta == 0 else f"async (max_staleness {eta})"
        line = f"  {s['segment']}: {span}, {how}"
        if s["steps"]:
            line += (f": {s['accepted_rollouts_per_s']:.1f} accepted rollouts/s, trainer idle "
                     f"{s['trainer_idle_ratio']:.1%}, reward {_num(s['reward_first'])} -> "
                     f"{_num(s['reward_last'])}")
        verdict = _verdict(s["overlap"])
        if verdict:
            line += f"; {verdict}"
        if s["worker_losses"]:
            line += f"; {s['worker_losses']} worker loss(es)"
        line += f"; {_ended(s['stopped'])}"
        lines.append(line)
    return "\n".join(lines)


def _verdict(o: dict[str, Any]) -> str:
    v = o.get("verdict")
    if v not in ("paid", "did not pay"):
        return ""
    if o.get("verdict_source") == "measured":
        fb = o.get("fallback") or {}
        steps = fb.get("steps") or {}
        return (f"asynchrony {v} (measured by the sync fallback; steps async/sync "
                f"{steps.get('async', 0)}/{steps.get('sync', 0)})")
    ratio = o.get("ratio")
    x = f" ({ratio:.2f}x the sync estimate)" if isinstance(ratio, int | float) else ""
    return f"asynchrony {v}{x}"


def _ended(stopped: str | None) -> str:
    if stopped is None:
        return "ended without closing (killed)"
    return "ended: done" if stopped == "done" else f"stopped: {stopped}"


def _num(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "-"


__all__ = ["OVERLAP_KEYS", "SEGMENT_FIGURES", "SegmentFold", "render_segments"]
