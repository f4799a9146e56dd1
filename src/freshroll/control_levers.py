"""The controller when the window is the limit: long-tail levers, and workers for the window.

Pure, like :mod:`freshroll.control` (whose ``decide`` calls :func:`steer_window` after its
worker rule). A *conflict* window (``ω ≥ idle_high`` and ``β ≥ blocked_high``: the trainer
waits while workers sit blocked by admission) says the admission window is held by
stragglers: groups whose slowest member has not finished. Workers are not the lever there
(more would be blocked too); the levers free the window sooner:

    over-provisioning   x extra requests per admitted group, stop at target
                        (freshroll.stop_at_target), x ∈ [0, max_extra]
    group deadlines     a group's stragglers cut past deadline_factor × p50
                        (freshroll.control_tail), on or off

**Lever rule** (:func:`tail_levers`; only with ``max_extra > 0``; one move per
``lever_cooldown_s``, so each step is measured before the next)::

    χ = cancelled / (cancelled + generated)    requests of the window the stop threw away
    conflict                   -> deadline on;  x' = min(max_extra, x + 1)
    otherwise, χ > chi_high    -> x' = max(0, x − 1)     (extras cost more than they buy)
    otherwise                  -> kept                   (deadlines, once on, stay on: the
                                                          tail does not go away)

**Workers for the window** (:func:`window_workers`; with the levers on, as they are). The
freshness window admits at most ``(η + 1) × B`` groups ahead of the trainer, each of
``G + x`` requests; workers beyond those whose slots (``c`` each) hold all of them are
blocked whenever the window is::

    n_w = ceil((η + 1) × B × (G + x) × (1 + headroom) / c)

* in a conflict, the worker count is steered down to ``n_w``: ``spare = n − n_w −
  down_margin``; ``spare ≥ 1`` and the down cooldown passed since the last change ->
  ``n' = n − min(floor(spare), ceil(spare × down_gain))``; otherwise kept (the worker rules
  of :mod:`freshroll.control` read the unblocked rate ``p`` of a worker, which over the few
  unblocked seconds of a blocked one is noise);
* in every other reading, a scale-down of those rules stops at ``min(n_w, n)``: fewer
  workers would leave admitted requests queued, and every group they belong to waits.

A blocked worker costs its worker-seconds and adds nothing, so neither raises the trainer's
idle share. When the trainer changes speed the pipeline leaves the conflict
(producer-bound: the trainer waits on workers that are not blocked; trainer-bound: it is
fed while workers are blocked) and the rules of :mod:`freshroll.control` re-balance from the
demand ``D`` (measured over whole trainer steps, ``Snapshot.fed_rate``) and ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

Side = Literal["producer", "trainer", "balanced", "conflict", "unknown"]


class Bounds(Protocol):
    """What the rules read of :class:`freshroll.control.ControlConfig`."""

    @property
    def group_size(self) -> int: ...
    @property
    def max_extra(self) -> int: ...
    @property
    def chi_high(self) -> float: ...
    @property
    def lever_cooldown_s(self) -> float: ...
    @property
    def headroom(self) -> float: ...
    @property
    def down_margin(self) -> float: ...
    @property
    def down_gain(self) -> float: ...
    @property
    def down_cooldown_s(self) -> float: ...
    @property
    def min_workers(self) -> int: ...


class Live(Protocol):
    """What the rules read of :class:`freshroll.control.Settings`."""

    @property
    def workers(self) -> int: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def extra(self) -> int: ...
    @property
    def deadline(self) -> bool: ...


class Window(Protocol):
    """What the rules read of :class:`freshroll.control.Snapshot`."""

    @property
    def settings(self) -> Live: ...
    @property
    def max_staleness(self) -> int: ...
    @property
    def batch_groups(self) -> int: ...
    @property
    def discards(self) -> Mapping[str, int]: ...
    @property
    def generated(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Levers:
    """The tail levers' settings: extra requests per group, group deadlines on."""

    extra: int = 0
    deadline: bool = False


@dataclass(frozen=True, slots=True)
class Steered:
    """:func:`steer_window`'s result."""

    workers: int
    why_workers: str
    levers: Levers
    why_levers: str  # "" when the levers are off
    workers_down: bool  # a conflict's scale-down (its time starts the down cooldown)
    levers_moved: bool


def cancelled_share(discards: Mapping[str, int], generated: int) -> float:
    """χ of a window (module docstring); 0 when nothing was cancelled."""
    cancelled = discards.get("cancelled", 0)
    return cancelled / (cancelled + generated) if cancelled > 0 else 0.0


def tail_levers(side: Side, levers: Levers, chi: float, cfg: Bounds, *,
                since: float) -> tuple[Levers, str]:
    """The levers after one window (module docstring); ``since``: seconds since their last
    move. The reason is "" when the levers are off (``max_extra`` 0)."""
    max_extra, chi_high = cfg.max_extra, cfg.chi_high
    if max_extra <= 0:
        return levers, ""
    if since < cfg.lever_cooldown_s:
        return levers, f"tail levers cooling down (extra {levers.extra})"
    if side == "conflict":
        x = min(max_extra, levers.extra + 1)
        new = Levers(x, True)
        if new == levers:
            return levers, f"window-bound: extra at max_extra {max_extra}, deadlines on"
        return new, f"window-bound: extra {levers.extra}->{x}, deadlines on"
    if chi > chi_high and levers.extra > 0:
        x = levers.extra - 1
        return Levers(x, levers.deadline), (f"extra {levers.extra}->{x}: {chi:.0%} of the "
                                            f"window's requests cancelled > {chi_high:.0%}")
    return levers, f"tail levers kept (extra {levers.extra}, cancelled {chi:.0%})"


def window_workers(eta: int, batch_groups: int, group: int, concurrency: int,
                   headroom: float) -> int:
    """``n_w``: the workers whose slots hold every request the freshness window admits."""
    requests = (max(0, eta) + 1) * batch_groups * group
    return max(1, math.ceil(requests * (1 + headroom) / max(1, concurrency)))


def conflict_workers(workers: int, need: int, cfg: Bounds, *,
                     since: float) -> tuple[int, str]:
    """The worker count after a conflict window, steered to ``need`` = ``n_w`` (module
    docstring), and why; ``since``: seconds since the last change of the worker count."""
    need = max(cfg.min_workers, need)
    spare = workers - need - cfg.down_margin
    if spare < 1:
        return workers, f"window-bound: the window fills {need} workers' slots, {workers} kept"
    if since < cfg.down_cooldown_s:
        return workers, "window-bound: scale-down cooling down"
    k = min(math.floor(spare), math.ceil(spare * cfg.down_gain))
    return workers - k, f"window-bound: -{k} workers: the window fills {need} workers' slots"


def steer_window(side: Side, snap: Window, workers: int, why: str, cfg: Bounds, *,
                 since_workers: float, since_levers: float) -> Steered:
    """Both rules on one window: ``workers`` and ``why`` are what the worker rules of
    :mod:`freshroll.control` chose."""
    s = snap.settings
    if cfg.max_extra <= 0:  # the levers off: the worker rules of control.py alone
        return Steered(workers, why, Levers(s.extra, s.deadline), "", False, False)
    need = window_workers(snap.max_staleness, snap.batch_groups, cfg.group_size + s.extra,
                          s.concurrency, cfg.headroom)
    down = False
    if side == "conflict":
        workers, why = conflict_workers(s.workers, need, cfg, since=since_workers)
        down = workers < s.workers
    elif workers < min(need, s.workers):  # a scale-down stops at the window's slots
        workers, why = min(need, s.workers), f"{why} (down to {need}: the window's slots)"
    was = Levers(s.extra, s.deadline)
    lev, why_t = tail_levers(side, was, cancelled_share(snap.discards, snap.generated), cfg,
                             since=since_levers)
    return Steered(workers, why, lev, why_t, down, lev != was)


__all__ = ["Bounds", "Levers", "Live", "Side", "Steered", "Window", "cancelled_share",
           "conflict_workers", "steer_window", "tail_levers", "window_workers"]
