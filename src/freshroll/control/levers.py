"""The controller when the window is the limit: long-tail levers, and workers for the window.

Pure, like :mod:`freshroll.control.controller` (whose ``decide`` calls :func:`steer_window`
after its worker rule). A *conflict* window (``ω ≥ idle_high`` and ``β ≥ blocked_high``: the
trainer waits while workers sit blocked by admission) says the admission window is held by
stragglers: groups whose slowest member has not finished. Workers are not the lever there
(more would be blocked too); the levers free the window sooner:

    over-provisioning   x extra requests per admitted group, stop at target
                        (freshroll.kernel.stop_at_target), x ∈ [0, max_extra]
    group deadlines     a group's stragglers cut past deadline_factor × p50
                        (freshroll.control.tail), on or off

**Lever rule** (:func:`tail_levers`; only with ``max_extra > 0``; one move per
``lever_cooldown_s``, so each step is measured before the next)::

    χ = cancelled / (cancelled + generated)    requests of the window the stop threw away
    conflict                   -> deadline on;  x' = min(max_extra, x + 1)
    otherwise, χ > chi_high    -> x' = max(0, x − 1)     (extras cost more than they buy)
    otherwise                  -> kept                   (deadlines, once on, stay on: the
                                                          tail does not go away)

**Workers for the window** (:func:`window_workers`; with the levers on, as they are). The
admission window admits at most ``W × B`` groups ahead of the trainer (``W``: ``η + 1``, or
``run.admission_window``: :func:`freshroll.kernel.freshness.window_steps`), each of ``G + x``
requests; workers beyond those whose slots (``c`` each) hold all of them are blocked whenever
the window is::

    n_w = ceil(W × B × (G + x) × (1 + headroom) / c)

* in a conflict, the worker count is steered to a target: ``n_w``, scaled with the
  trainer's demand ``D`` (``Snapshot.fed_rate``, measured over whole trainer steps) above the
  lowest demand ``D_0`` seen (the reference, kept in the controller state)::

      target = n_w                              if D < (1 + DEMAND_BAND) × D_0
               min(max_workers, ceil(n_w × D / D_0))  otherwise

  (a faster trainer while the window binds: more workers run fewer sequences each, every
  request ends sooner and the window turns over faster). Up at once (after the up
  cooldown); down by a share of the spare, ``spare = n − target − down_margin ≥ 1`` ->
  ``n' = n − min(floor(spare), ceil(spare × down_gain))`` after the down cooldown; otherwise
  kept (the worker rules of :mod:`freshroll.control.controller` read the unblocked rate ``p`` of a
  worker, which over the few unblocked seconds of a blocked one is noise);
* in every other reading, a scale-down of those rules stops at ``min(target, n)``: fewer
  than ``n_w`` would leave admitted requests queued, and every group they belong to waits.

The reference ``D_0`` is the lowest demand measured in any window (with the levers on).

**The admission window is not a lever here** (``run.admission_window``, set by the config
only). Widening it in a conflict would feed the trainer more, but measured on P2 (docs/bench.md,
"A wider admission window") three freshness windows raised the stale discards several times
more than they cut the trainer's idle share, under ``continue`` + ``newest_token`` too: a
group waits for its slowest member and its first ones age meanwhile. A rule would need a
stale-share ceiling far above issue 26's 1%, and a live window recorded per decision for
``verify`` (today ``opened`` records it).

A blocked worker costs its worker-seconds and adds nothing, so neither raises the trainer's
idle share. When the trainer changes speed the pipeline leaves the conflict
(producer-bound: the trainer waits on workers that are not blocked; trainer-bound: it is
fed while workers are blocked) and the rules of :mod:`freshroll.control.controller` re-balance
from the demand ``D`` (measured over whole trainer steps, ``Snapshot.fed_rate``) and ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

Side = Literal["producer", "trainer", "balanced", "conflict", "unknown"]
DEMAND_BAND = 0.5  # demand above the reference by less than this: the pool is not scaled


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
    @property
    def max_workers(self) -> int: ...
    @property
    def up_cooldown_s(self) -> float: ...


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
    def admission_window(self) -> int | None: ...
    @property
    def discards(self) -> Mapping[str, int]: ...
    @property
    def generated(self) -> int: ...
    @property
    def fed_rate(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Levers:
    """The tail levers' settings: extra requests per group, group deadlines on."""

    extra: int = 0
    deadline: bool = False


@dataclass(frozen=True, slots=True)
class Steered:
    """:func:`steer_window`'s result: the settings and the controller state's times."""

    workers: int
    why_workers: str
    levers: Levers
    why_levers: str  # "" when the levers are off
    last_up: float | None
    last_down: float | None
    last_lever: float | None
    demand_ref: float | None


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
                   headroom: float, window: int | None = None) -> int:
    """``n_w``: the workers whose slots hold every request the admission window admits
    (``window``: ``W`` in trainer steps; None: ``η + 1``)."""
    requests = (window if window is not None else max(0, eta) + 1) * batch_groups * group
    return max(1, math.ceil(requests * (1 + headroom) / max(1, concurrency)))


def conflict_target(need: int, demand: float, demand_ref: float | None, max_workers: int
                    ) -> tuple[int, float | None]:
    """The workers a conflict steers to, and the reference demand after this window: ``n_w``,
    scaled with the trainer's demand above the lowest seen (module docstring)."""
    if demand <= 0:
        return need, demand_ref
    ref = demand if demand_ref is None else min(demand_ref, demand)
    ratio = demand / ref
    return (need if ratio < 1 + DEMAND_BAND else min(max_workers, math.ceil(need * ratio))), ref


def conflict_workers(workers: int, target: int, cfg: Bounds, *, since_down: float,
                     since_up: float) -> tuple[int, str]:
    """The worker count after a conflict window, steered to ``target`` (module docstring),
    and why; ``since_*``: seconds since the last scale-down / scale-up."""
    target = max(cfg.min_workers, target)
    if target > workers:
        if since_up < cfg.up_cooldown_s:
            return workers, "window-bound: scale-up cooling down"
        return target, f"window-bound: +{target - workers} workers: the trainer's demand grew"
    spare = workers - target - cfg.down_margin
    if spare < 1:
        return workers, f"window-bound: the window fills {target} workers' slots, {workers} kept"
    if min(since_down, since_up) < cfg.down_cooldown_s:
        return workers, "window-bound: scale-down cooling down"
    k = min(math.floor(spare), math.ceil(spare * cfg.down_gain))
    return workers - k, f"window-bound: -{k} workers: the window fills {target} workers' slots"


def window_bound(last_conflict_at: float | None, cooldown_s: float, now: float) -> bool:
    """Whether a conflict (the admission window the limit) was read within ``cooldown_s``
    (``down_cooldown_s``): :mod:`freshroll.control.controller` then neither scales down nor
    hard-cuts.

    Decisions come every ``interval_s``, often less than a trainer step (5 s against 8 s on
    P1), so a window-bound pipeline alternates between conflict windows (the trainer waits on
    the window's stragglers) and trainer-bound ones (its busy phase). The second are not
    surplus production, and their stale discards are stragglers. Measured on P1, before this
    guard the controller removed workers and halved concurrency in them, and fell below a
    static run on every worker of the pool; with it, level with that on fewer worker-seconds
    (before: CHANGELOG.md, 2026-12-06, "After the controller's window-bound guard"; after:
    docs/bench.md, "The simulated profiles, virtual clock, 100 steps, 3 seeds")."""
    return _since(now, last_conflict_at) < cooldown_s


def _since(now: float, t: float | None) -> float:
    return math.inf if t is None else now - t


def steer_window(side: Side, snap: Window, workers: int, why: str, cfg: Bounds,
                 demand_ref: float | None, *, now: float,
                 last: tuple[float | None, float | None, float | None]) -> Steered:
    """Both rules on one window: ``workers`` and ``why`` are what the worker rules of
    :mod:`freshroll.control.controller` chose; ``last``: the last scale-up, scale-down and
    lever move."""
    s = snap.settings
    up, down, lever = last
    if cfg.max_extra <= 0:  # the levers off: the worker rules of controller.py alone
        return Steered(workers, why, Levers(s.extra, s.deadline), "", up, down, lever,
                       demand_ref)
    need = window_workers(snap.max_staleness, snap.batch_groups, cfg.group_size + s.extra,
                          s.concurrency, cfg.headroom, snap.admission_window)
    target, demand_ref = conflict_target(need, snap.fed_rate, demand_ref, cfg.max_workers)
    if side == "conflict":
        workers, why = conflict_workers(s.workers, target, cfg, since_down=_since(now, down),
                                        since_up=_since(now, up))
        up = now if workers > s.workers else up
        down = now if workers < s.workers else down
    elif workers < min(target, s.workers):  # a scale-down stops at the target
        workers, why = min(target, s.workers), f"{why} (down to {target}: the window's target)"
    was = Levers(s.extra, s.deadline)
    lev, why_t = tail_levers(side, was, cancelled_share(snap.discards, snap.generated), cfg,
                             since=_since(now, lever))
    return Steered(workers, why, lev, why_t, up, down, now if lev != was else lever,
                   demand_ref)


__all__ = ["DEMAND_BAND", "Bounds", "Levers", "Live", "Side", "Steered", "Window",
           "cancelled_share", "conflict_target", "conflict_workers", "steer_window",
           "tail_levers", "window_bound", "window_workers"]
