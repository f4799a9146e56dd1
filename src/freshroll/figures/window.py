"""The freshness window's bound on the trainer (issue 26): how much of the trainer's demand
admission can meet at all, from the ledger alone.

Admission (:mod:`freshroll.kernel.freshness`) keeps at most ``W = w × B`` groups admitted and
not yet consumed or discarded (``B``: groups per trainer step, ``rollout.batch_groups``; ``w``:
the admission window in trainer steps in force, ``opened.admission_window``, ``η + 1`` by
default).
A group that becomes ``ready`` spent at least its latency ``L_i`` (``requested`` to
``ready``: its slowest member's generation and reward) inside that window, so over a run of
``T`` seconds ``Σ L_i ≤ W × T`` (Little's law), and groups reach the trainer at most at::

    ready groups/s  ≤  W / L                      L = mean L_i over the ready groups

The trainer, never waiting, consumes ``λ = B / s`` groups per second (``s``: the mean
trainer step, ``committed.ts - leased.ts``). So the share of its demand the pipeline can
meet, whatever the worker count, is at most::

    bound = min(1, W / (λ × L))  =  min(1, w × s / L)          (w = η + 1 by default)

and a run's efficiency measured against its own trainer, ``E = accepted/s / (λ × G)``
(``G`` samples per group; for a run whose trainer steps take ``s`` this is its busy share
``1 - trainer idle``), is at most ``bound`` (up to the run's edges: ``T`` is the trainer's
wall time, from its first wait to its last commit). A group stays in the window past its
``ready`` (until the step that trains it commits) and stale groups take window time without
being trained on, so the bound is an upper limit, not a forecast; when it is far below 1 no
worker count and no controller can feed the trainer, only a shorter group latency
(deadlines, over-provisioning) or a wider window (η, or ``run.admission_window``) can.

Groups that never become ready (every member discarded: dropped, cut at a deadline,
cancelled) are counted apart, with their mean latency ``requested`` to the discard that ended
the last member; stale discards of ready groups happen after ``ready`` and leave ``L`` alone,
and discards that are no outcome (``fenced``: re-issued; ``shutdown``: the run ended) are
not counted.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from freshroll.figures.tally import UNCOUNTED_DISCARD_REASONS
from freshroll.kernel.freshness import window_steps
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import group_of


def window_bound(*, window_groups: float, trainer_groups_per_s: float,
                 latency_s: float) -> float:
    """``min(1, W / (λ × L))`` (module docstring); NaN when ``λ`` or ``L`` is unknown (not
    positive and finite), 1 when the window is infinite."""
    if not (trainer_groups_per_s > 0 and latency_s > 0 and math.isfinite(latency_s)
            and math.isfinite(trainer_groups_per_s)):
        return math.nan
    return min(1.0, window_groups / (trainer_groups_per_s * latency_s))


class _Group:
    """One admitted group while it holds a place in the window."""

    __slots__ = ("admitted", "discarded", "ready", "size")

    def __init__(self, ts: float, size: int) -> None:
        self.admitted, self.size, self.discarded, self.ready = ts, size, 0, False


class WindowFold:
    """The figures of :func:`window_bound`, folded one event at a time (a
    :class:`~freshroll.figures.fold.Fold`). Per group only its admission time, size,
    discarded members and whether it is ready, while it holds a place in the window (until
    the commit of the step that trained it, or its end by discard); per lease its time and
    groups until committed or released.

    Beside the bound, how full the window was: ``occupancy_groups``, the mean number of
    groups holding a place (``Σ residence / T``, ``T`` from the first admission to the last
    event; residence: admission to the commit that trained the group, or to the discard that
    ended it; a group still open counts to the last event), and ``occupancy_discarded``, the
    part of it held by groups discarded in the end (stale, dropped, cut). A window that is
    full (occupancy near ``W``) is the limit; a share held by discarded groups is spent."""

    KINDS: ClassVar = (ev.Opened, ev.Requested, ev.Ready, ev.Discarded, ev.Leased,
                       ev.LeaseReleased, ev.Committed)

    def __init__(self) -> None:
        self.max_staleness: int | None = None
        self.batch_groups: int | None = None
        self.window_steps: int | None = None  # w: the last opened's admission window
        self.groups: dict[str, _Group] = {}  # admitted, holding a place
        self.leases: dict[str, tuple[float, list[str]]] = {}  # until committed / released
        self.ready = 0
        self.ready_s = 0.0  # Σ L_i over the ready groups
        self.dropped = 0  # groups every member of which was discarded, never ready
        self.dropped_s = 0.0
        self.steps = 0
        self.step_s = 0.0  # Σ (committed - leased)
        self.first: float | None = None  # the first admission
        self.last = 0.0  # the last event's time
        self.held_s = 0.0  # Σ residence of the groups that left the window
        self.held_discarded_s = 0.0  # ... of those discarded in the end

    def feed(self, e: Any) -> None:
        self.last = max(self.last, e.ts)
        if isinstance(e, ev.Opened):
            self.max_staleness, self.batch_groups = e.max_staleness, e.batch_groups
            self.window_steps = window_steps(e.max_staleness) if e.admission_window is None \
                else e.admission_window
            self.leases.clear()  # a resume re-leases: no commit of the last one comes
        elif isinstance(e, ev.Requested):
            self.groups[e.group] = _Group(e.ts, e.size)
            if self.first is None:
                self.first = e.ts
        elif isinstance(e, ev.Ready):
            g = self.groups.get(e.group)
            if g is not None and not g.ready:
                g.ready = True
                self.ready += 1
                self.ready_s += e.ts - g.admitted
        elif isinstance(e, ev.Discarded):
            self._discarded(e)
        elif isinstance(e, ev.Leased):
            self.leases[e.lease] = (e.ts, e.groups)
        elif isinstance(e, ev.LeaseReleased):
            self.leases.pop(e.lease, None)
        elif isinstance(e, ev.Committed):
            self._committed(e)

    def _committed(self, e: ev.Committed) -> None:
        lease = self.leases.pop(e.lease, None)
        if lease is None:
            return
        self.steps += 1
        self.step_s += e.ts - lease[0]
        for group in lease[1]:
            g = self.groups.pop(group, None)
            if g is not None:
                self.held_s += e.ts - g.admitted

    def _discarded(self, e: ev.Discarded) -> None:
        if e.reason in UNCOUNTED_DISCARD_REASONS:  # re-issued, or the run ended: no outcome
            return
        group = group_of(e.request)
        g = self.groups.get(group)
        if g is None:  # ended already, or not admitted in this ledger
            return
        if g.ready:  # a ready group is discarded whole (stale, dropped): it leaves now
            self._leave(group, e.ts)
            return
        g.discarded += 1
        if g.discarded >= g.size:
            self.dropped += 1
            self.dropped_s += e.ts - g.admitted
            self._leave(group, e.ts)

    def _leave(self, group: str, ts: float) -> None:
        g = self.groups.pop(group)
        self.held_s += ts - g.admitted
        self.held_discarded_s += ts - g.admitted

    def result(self) -> dict[str, Any] | None:
        """``summary.json``'s ``window_bound``; None before the first ``opened``."""
        if self.window_steps is None or self.batch_groups is None:
            return None
        window = self.window_steps * self.batch_groups
        latency = self.ready_s / self.ready if self.ready else math.nan
        step = self.step_s / self.steps if self.steps else math.nan
        rate = self.batch_groups / step if step > 0 else math.nan
        span = self.last - self.first if self.first is not None else 0.0
        held = self.held_s + sum(self.last - g.admitted for g in self.groups.values())
        return {
            "latency_s": latency, "ready_groups": self.ready,
            "discard_latency_s": self.dropped_s / self.dropped if self.dropped else math.nan,
            "discarded_groups": self.dropped,
            "trainer_step_s": step, "trainer_groups_per_s": rate,
            "window_groups": window,
            "occupancy_groups": held / span if span > 0 else math.nan,
            "occupancy_discarded": self.held_discarded_s / span if span > 0 else math.nan,
            "bound": window_bound(window_groups=window, trainer_groups_per_s=rate,
                                  latency_s=latency),
        }


#: the end of a run names the bound when it is under this: the window limits the trainer
SAY_BELOW = 0.9


def render_window(w: Any, max_staleness: Any = None) -> str:
    """The line a run's end prints when the window limits the trainer (bound under
    :data:`SAY_BELOW`); empty otherwise, and for a synchronous run (``max_staleness`` 0: it
    has no freshness window to widen; its batches wait on generation by design)."""
    if max_staleness == 0:
        return ""
    if not isinstance(w, dict) or not isinstance(w.get("bound"), float):
        return ""
    if not w["bound"] < SAY_BELOW:
        return ""
    return (f"window bound {w['bound']:.2f}: admission's window of {w['window_groups']} groups "
            f"over a group latency of {w['latency_s']:.1f} s feeds at most "
            f"{w['bound']:.0%} of the trainer's {w['trainer_groups_per_s']:.2f} groups/s, "
            "whatever the worker count (docs/tails.md)")


__all__ = ["SAY_BELOW", "WindowFold", "render_window", "window_bound"]
