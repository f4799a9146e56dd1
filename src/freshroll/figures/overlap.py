"""Did asynchrony pay? The stages' overlap and what the sync mode would have taken, from the
ledger alone (plus the host's load, observed at the end of the run).

An asynchronous run pays only when generation and training really run at once. When they
take turns (the GIL of one interpreter, another process on one of the cores, an engine
that serialises with the trainer) an async run is no faster than a synchronous one and
still pays for staleness. This module says which happened, from the run's own ledger:

- **generation busy** per worker: the union of its calls' intervals ``[t(generated) -
  gen_s, t(generated)]`` (the completions of one lock-step call share one interval);
  ``gen_busy_s`` is the sum over workers;
- **training busy**: ``train_s`` summed over the committed steps (intervals ``[t(committed)
  - train_s, t(committed)]``); trainer wait: ``leased.wait_s`` summed
  (:func:`freshroll.figures.metrics.trainer_wait_s`); wall:
  :func:`freshroll.figures.metrics.wall_s`;
- **parallelism** ``p = (gen_busy_s + train_busy_s) / wall_s`` (1: one stage at a time;
  2: both stages busy all the time), and **overlapped**: the share of the shorter stage's
  busy time during which the other stage was busy too;
- **slowdown** of each stage while the other ran: its seconds per unit of work (a
  completion, a step) over the calls / steps the other stage overlapped almost wholly,
  over the same for those that ran alone (:func:`slowdown`; None without at least
  :data:`MIN_SOLO` of each). Two threads of one interpreter taking turns on the GIL, or two
  stages sharing the one core another process left, show ~2; a real overlap ~1. A stage
  that never ran alone (the bottleneck of an async run) is taken to be slowed as much as
  the other one (the two share what the machine gives them); no figure at all: 1;
- **effective parallelism**: the same as ``parallelism`` with the overlapped seconds of
  each stage divided by its slowdown (seconds of solo work done per wall second: 1 is
  what a sync run does);
- **sync estimate**: one synchronous step = the generation of a batch + the hand-off of its
  last completion to the trainer (the median ``t(rewarded) - t(generated)``: scoring and
  the loop's dispatch, which a sync step waits for) + its training step + the trainer's own
  per-step overhead (commit, checkpoint, publish: ``(wall - wait - train) / steps``), each
  stage at its solo speed (:func:`solo_seconds`): generation of a batch = ``B x`` (solo
  seconds per completion over all calls) / the mean number of calls in flight; training:
  the median step's solo seconds;
- **verdict**: an async run (``max_staleness > 0``) paid when its accepted rollouts/s is
  above the estimate by more than :data:`PAY_MARGIN`; otherwise it says so plainly (the
  summary, ``freshroll verify``'s notes and the run's last lines on stderr);
- **measured verdict**: when the sync fallback (:mod:`freshroll.pipeline.fallback`) chose a
  mode, the verdict is its last choice instead (``verdict_source: measured``): async and
  sync windows of the same run, under the same load, beat any estimate. ``fallback`` lists
  each probe's rates and counts the steps run in each mode.
"""

from __future__ import annotations

import bisect
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from freshroll.figures.metrics import Tally, accepted_rollouts_per_s, trainer_wait_s, wall_s
from freshroll.ledger import events as ev

#: an async run "paid" when its accepted rollouts/s beats the sync estimate by more than this
PAY_MARGIN = 0.05
#: a call / step overlapped by the other stage for less than this share of it ran alone
SOLO_SHARE = 0.1
#: solo observations needed before a stage's estimate uses only them
MIN_SOLO = 2

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The disjoint, sorted union of ``intervals`` (empty ones dropped)."""
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def measure(intervals: Sequence[Interval]) -> float:
    """Total length of disjoint ``intervals``."""
    return sum(b - a for a, b in intervals)


def overlap_with(a: Interval, disjoint: Sequence[Interval]) -> float:
    """Length of ``a`` covered by the disjoint sorted ``disjoint`` intervals."""
    return Cover(disjoint).covered(a)


class Cover:
    """Disjoint sorted intervals, for many :meth:`covered` queries (a bisection each)."""

    def __init__(self, disjoint: Sequence[Interval]) -> None:
        self.intervals = disjoint
        self.ends = [b for _, b in disjoint]

    def covered(self, a: Interval) -> float:
        """Length of ``a`` covered by the intervals."""
        total = 0.0
        i = bisect.bisect_right(self.ends, a[0])
        while i < len(self.intervals) and self.intervals[i][0] < a[1]:
            s, b = self.intervals[i]
            total += max(0.0, min(a[1], b) - max(a[0], s))
            i += 1
        return total


def intersection(xs: Sequence[Interval], ys: Sequence[Interval]) -> float:
    """Length of the intersection of two disjoint sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True, slots=True)
class Call:
    """One generation call of a worker: its interval and how many completions it returned."""

    worker: str
    start: float
    end: float
    n: int


class OverlapFold:
    """The stage intervals of a ledger, folded one event at a time (``feed``; a
    :class:`~freshroll.figures.fold.Fold`). Its figures need the run's
    :class:`~freshroll.figures.metrics.Tally` as well: given at construction or to
    :meth:`result`."""

    KINDS: ClassVar = (ev.Opened, ev.Started, ev.Generated, ev.Rewarded, ev.Committed,
                       ev.Discarded, ev.ModeDecided)

    def __init__(self, tally: Tally | None = None) -> None:
        self.tally = tally  # the run's (fed by its owner), for result() without one
        self.worker_of: dict[str, str] = {}  # attempt -> worker, until generated
        self.open: dict[tuple[str, float], list[float]] = {}  # (worker, gen_s) -> start, end, n
        self.done: list[Call] = []
        self.generated_at: dict[str, float] = {}  # attempt -> t(generated), until rewarded
        self.handoffs: list[float] = []  # t(rewarded) - t(generated) per sample
        self.train: list[tuple[float, float]] = []  # (start, end) per committed step
        self.batch = 0
        self.max_staleness: int | None = None
        self.modes = ModeFold()
        self._fed = 0
        self._cached: tuple[int, int, dict[str, Any]] | None = None  # (fed, steps, result)

    def feed(self, e: Any) -> None:
        self._fed += 1
        if isinstance(e, ev.Started):
            self.worker_of[e.sample] = e.worker
        elif isinstance(e, ev.Generated):
            self._generated(e)
        elif isinstance(e, ev.Rewarded):
            t = self.generated_at.pop(e.sample, None)
            if t is not None:
                self.handoffs.append(e.ts - t)
        elif isinstance(e, ev.Committed):
            self.train.append((e.ts - e.train_s, e.ts))
            self.modes.feed(e)
        elif isinstance(e, ev.ModeDecided):
            self.modes.feed(e)
        elif isinstance(e, ev.Discarded) and e.sample is not None:
            self.worker_of.pop(e.sample, None)
            self.generated_at.pop(e.sample, None)
        elif isinstance(e, ev.Opened):
            self.batch = e.batch_groups * e.group_size
            self.max_staleness = e.max_staleness
            self.modes.feed(e)

    def _generated(self, e: ev.Generated) -> None:
        """The completions of one call share its ``gen_s`` (one clock reading on the worker)
        and are recorded within moments of each other: one :class:`Call`."""
        worker = self.worker_of.pop(e.sample, "?")
        self.generated_at[e.sample] = e.ts
        start, key = e.ts - e.gen_s, (worker, e.gen_s)
        slot = self.open.get(key)
        if slot is not None and abs(start - slot[0]) > 0.5 * e.gen_s + 0.01:
            self.done.append(_call(worker, slot))  # the same gen_s again: another call
            slot = None
        if slot is None:
            self.open[key] = [start, e.ts, 1.0]
        else:
            slot[0], slot[1], slot[2] = min(slot[0], start), max(slot[1], e.ts), slot[2] + 1

    def call_list(self) -> list[Call]:
        return [*self.done, *(_call(w, slot) for (w, _), slot in self.open.items())]

    def result(self, tally: Tally | None = None) -> dict[str, Any]:
        """The ``overlap`` block of ``summary.json`` (see the module doc) with ``tally``'s
        figures (None: the one given at construction); computed once per state of the fold
        (``summary()`` is asked for more than once at a run's end)."""
        if tally is None:
            if self.tally is None:
                raise ValueError("an OverlapFold's result needs the run's Tally")
            tally = self.tally
        if self._cached is not None and self._cached[:2] == (self._fed, tally.steps):
            return self._cached[2]
        result = overlap_figures(self.call_list(), self.train, tally, self.batch,
                               self.max_staleness, _median(self.handoffs))
        fallback = self.modes.result()
        result["fallback"] = fallback
        result["verdict_source"] = "estimated" if result["verdict"] is not None else None
        if fallback is not None and fallback["mode"] is not None and self.max_staleness:
            result["verdict"] = "paid" if fallback["mode"] == "async" else "did not pay"
            result["verdict_source"] = "measured"
        self._cached = (self._fed, tally.steps, result)
        return result


class ModeFold:
    """The sync fallback's ``mode_decided`` events: each probe's rates, and the steps
    committed in each mode (a resume starts again in async). A
    :class:`~freshroll.figures.fold.Fold` (``feed``); :class:`OverlapFold` feeds it."""

    KINDS: ClassVar = (ev.Opened, ev.Committed, ev.ModeDecided)

    def __init__(self) -> None:
        self.commits = 0  # committed steps fed so far
        self.probes: list[dict[str, Any]] = []
        self.steps = {"async": 0, "sync": 0}
        self._mode, self._since = "async", 0
        self._chosen: str | None = None
        self._seen = False
        self.started: str | None = None  # why the run started in a mode it did not measure
        #: the fallbacks to sync for learning (``learning: ...`` reasons), not for rate
        self.learning: list[dict[str, Any]] = []

    def feed(self, e: Any) -> None:
        if isinstance(e, ev.Committed):
            self.commits += 1
        elif isinstance(e, ev.ModeDecided):
            self.decided(e)
        elif isinstance(e, ev.Opened):
            self.opened()

    def _close(self) -> None:
        self.steps[self._mode] += self.commits - self._since
        self._since = self.commits

    def decided(self, e: ev.ModeDecided) -> None:
        self._seen = True
        self._close()
        self._mode = e.mode if e.mode in self.steps else "async"
        if e.reason.startswith("learning:"):  # asynchrony costing learning, not its rate
            self._chosen = e.mode
            self.learning.append({"step": e.step, "reason": e.reason})
        elif e.phase == "chose" and (e.async_per_s is None or e.sync_per_s is None):
            self.started = e.reason  # a start in a mode, not a measurement (the thread probe's)
        elif e.phase == "chose":
            self._chosen = e.mode
            a, b = e.async_per_s, e.sync_per_s
            self.probes.append({
                "step": e.step, "async_per_s": a, "sync_per_s": b,
                "ratio": a / b if a is not None and b else None, "chose": e.mode,
                # an earlier run's choice this run started in (freshroll.pipeline.fallback)
                "reused": e.reason.startswith("reused:"),
            })

    def opened(self) -> None:
        """A resume starts again in async and probes afresh: an earlier segment's choice
        says nothing of the steps run since (its probes stay listed)."""
        self._close()
        self._mode = "async"
        self._chosen = None

    def result(self) -> dict[str, Any] | None:
        """None when the run never probed."""
        if not self._seen:
            return None
        self._close()  # the steps since the last switch, counted in its mode
        return {"probes": list(self.probes), "mode": self._chosen, "steps": dict(self.steps),
                "started": self.started, "learning": list(self.learning)}


def _call(worker: str, slot: list[float]) -> Call:
    return Call(worker, slot[0], max(slot[0], slot[1]), int(slot[2]))


def slowdown(parts: Sequence[tuple[float, float, int]]) -> float | None:
    """How much slower a stage ran while the other stage ran too (>= 1): seconds per unit of
    work over its mostly overlapped calls / steps (overlapped >= 1 - :data:`SOLO_SHARE`)
    over the same for those that ran alone (< :data:`SOLO_SHARE`); None without at least
    :data:`MIN_SOLO` of each. ``parts``: (length, overlapped seconds, units of work)."""
    solo = [(d, n) for d, o, n in parts if o < SOLO_SHARE * d]
    both = [(d, n) for d, o, n in parts if o >= (1 - SOLO_SHARE) * d]
    if len(solo) < MIN_SOLO or len(both) < MIN_SOLO:
        return None
    per_solo = sum(d for d, _ in solo) / sum(n for _, n in solo)
    per_both = sum(d for d, _ in both) / sum(n for _, n in both)
    return max(1.0, per_both / per_solo) if per_solo > 0 else None


def solo_seconds(length: float, overlapped: float, factor: float) -> float:
    """What a call / step of ``length`` seconds, ``overlapped`` of them with the other stage
    (there ``factor`` times slower), would have taken alone."""
    return length - overlapped + overlapped / factor


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def overlap_figures(calls: Sequence[Call], train: Sequence[Interval], tally: Tally, batch: int,
                    max_staleness: int | None, handoff_s: float = 0.0) -> dict[str, Any]:
    """Pure: the overlap figures of a run's calls, training steps and tally (module doc):
    each stage's busy time and their overlap, each at its solo speed (:func:`_solo`), the
    sync step that speed gives, and the verdict (:func:`_verdict`)."""
    wall = wall_s(tally)
    by_worker: dict[str, list[Interval]] = {}
    for c in calls:
        by_worker.setdefault(c.worker, []).append((c.start, c.end))
    busy = {w: measure(union(iv)) for w, iv in sorted(by_worker.items())}
    gen_all = union(iv for ivs in by_worker.values() for iv in ivs)
    train_u = union(train)
    gen_busy, train_busy = sum(busy.values()), sum(b - a for a, b in train)
    gen_wall = measure(gen_all)
    both = intersection(gen_all, train_u)
    shorter = min(gen_wall, measure(train_u))
    steps = len(train)
    solo = _solo(calls, train, gen_all, train_u)
    per_sample = solo.gen_s / solo.samples if solo.samples else math.nan
    in_flight = sum(c.end - c.start for c in calls) / gen_wall if gen_wall > 0 else 1.0
    gen_step = batch * per_sample / max(1.0, in_flight)
    # solo-equivalent share of the busy time
    gen_share = solo.gen_s / solo.gen_raw_s if solo.gen_raw_s > 0 else 1.0
    train_step = _median(solo.train_s)
    overhead = max(0.0, wall - trainer_wait_s(tally) - train_busy) / steps if steps else 0.0
    handoff = handoff_s if math.isfinite(handoff_s) else 0.0
    sync_step = gen_step + handoff + train_step + overhead
    estimate = batch / sync_step if sync_step > 0 and math.isfinite(sync_step) else math.nan
    rate = accepted_rollouts_per_s(tally)
    ratio = rate / estimate if estimate > 0 else math.nan
    return {
        "gen_busy_s": gen_busy, "gen_busy_s_by_worker": busy, "train_busy_s": train_busy,
        "trainer_wait_s": trainer_wait_s(tally), "wall_s": wall,
        "parallelism": (gen_busy + train_busy) / wall if wall > 0 else math.nan,
        "effective_parallelism": ((gen_busy * gen_share + sum(solo.train_s)) / wall
                                  if wall > 0 else math.nan),
        "overlapped": both / shorter if shorter > 0 else 0.0,
        "slowdown": {"generation": solo.generation, "training": solo.training},
        "sync_step_s": {"generation": gen_step, "handoff": handoff, "training": train_step,
                        "overhead": overhead, "total": sync_step},
        "sync_estimate_per_s": estimate, "accepted_rollouts_per_s": rate,
        "ratio": ratio, "verdict": _verdict(max_staleness, steps, ratio),
    }


class _Solo(NamedTuple):
    """The two stages at their solo speed: each one's slowdown while the other ran, and
    the seconds its calls / steps would have taken alone (:func:`solo_seconds`)."""

    generation: float | None  # generation's slowdown (:func:`slowdown`; None: not measured)
    training: float | None  # training's
    gen_s: float  # the generate calls' solo seconds, summed
    gen_raw_s: float  # the same calls' measured seconds, summed
    samples: int  # the completions they made
    train_s: list[float]  # each training step's solo seconds


def _solo(calls: Sequence[Call], train: Sequence[Interval], gen_all: Sequence[Interval],
          train_u: Sequence[Interval]) -> _Solo:
    """Each call / step: its length, and how much of it the other stage overlapped (over
    ``gen_all`` / ``train_u``: the union of each stage's busy intervals); a stage never
    measured alone is taken to be slowed as much as the other (module doc)."""
    by_train, by_gen = Cover(train_u), Cover(gen_all)
    gen_parts = [(c.end - c.start, by_train.covered((c.start, c.end)), c.n)
                 for c in calls if c.end > c.start]
    train_parts = [(b - a, by_gen.covered((a, b)), 1) for a, b in train if b > a]
    g = slowdown(gen_parts)
    t = slowdown(train_parts)
    gen_factor = g if g is not None else t if t is not None else 1.0
    train_factor = t if t is not None else g if g is not None else 1.0
    gen_solo = sum(solo_seconds(d, o, gen_factor) for d, o, _ in gen_parts)
    train_solo = [solo_seconds(d, o, train_factor) for d, o, _ in train_parts]
    return _Solo(g, t, gen_solo, sum(d for d, _, _ in gen_parts),
                 sum(n for _, _, n in gen_parts), train_solo)


def _verdict(max_staleness: int | None, steps: int, ratio: float) -> str | None:
    """sync (``max_staleness`` 0), paid (``ratio`` above 1 + :data:`PAY_MARGIN`) or did not
    pay; None without a setting, a step or a finite ratio."""
    if max_staleness is None or not steps:
        return None
    if max_staleness == 0:
        return "sync"
    if not math.isfinite(ratio):
        return None
    return "paid" if ratio > 1 + PAY_MARGIN else "did not pay"


# == the host (not in the ledger) =====================================================


def host_now() -> dict[str, Any]:
    """The host's load at the end of a run (``os.getloadavg``) and the cores this process
    may use (:func:`~freshroll.procs.available_cores`). Recorded beside the
    ledger's figures in ``summary.json`` (``host``): it is not recomputed by ``verify``."""
    from freshroll.procs import available_cores

    try:
        load = list(os.getloadavg())
    except (AttributeError, OSError):
        load = [math.nan] * 3
    return {"loadavg": load, "cores": available_cores(), "cpu_count": os.cpu_count()}


def render(overlap: Mapping[str, Any] | None, host: Mapping[str, Any] | None = None) -> str:
    """One plain line for an async run's end (empty for a sync run or without figures)."""
    line = _render_rate(overlap, host)
    fb = overlap.get("fallback") if line and overlap else None
    learned = fb.get("learning") if isinstance(fb, Mapping) else None
    if learned:
        last = learned[-1]
        line += (f"; fell back to sync {len(learned)} time(s) for learning, last at step "
                 f"{last['step']} ({last['reason'].removeprefix('learning: ')})")
    return line


def _render_rate(overlap: Mapping[str, Any] | None, host: Mapping[str, Any] | None) -> str:
    if not overlap or overlap.get("verdict") not in ("paid", "did not pay"):
        return ""
    o = overlap
    where = ""
    if host:
        load = (host.get("loadavg") or [math.nan])[0]
        where = f", load average {_num(load, '.1f')} on {host.get('cores', '?')} cores"
    figures = (f"stages overlapped {_num(o['overlapped'], '.0%')} (parallelism "
               f"{_num(o['parallelism'], '.2f')}){where}")
    rates = (f"{_num(o['accepted_rollouts_per_s'], '.1f')} accepted rollouts/s vs a sync "
             f"estimate of {_num(o['sync_estimate_per_s'], '.1f')}/s")
    fb = o.get("fallback")
    if o.get("verdict_source") == "measured" and fb and fb["probes"]:
        last, steps = fb["probes"][-1], fb["steps"]
        measured = (f"async windows {_num(last['ratio'], '.2f')}x the sync windows "
                    f"({_num(last['async_per_s'], '.1f')} vs {_num(last['sync_per_s'], '.1f')} "
                    f"accepted rollouts/s, {len(fb['probes'])} probe(s), "
                    + ("measured by an earlier run of the same work at a like load"
                       if last.get("reused") else "measured under this run's load")
                    + f"); steps run async/sync: {steps['async']}/{steps['sync']}")
        if o["verdict"] == "paid":
            return f"asynchrony paid: {measured}; {figures}"
        return (f"asynchrony did not pay in this run: {measured}; the sync fallback kept the "
                f"faster mode; {figures}")
    if fb and fb.get("started") and not fb["probes"]:
        steps = fb["steps"]
        return (f"the run started in sync mode ({fb['started']}) and ran async/sync "
                f"{steps['async']}/{steps['sync']} steps, no probe measured async; {figures}")
    if o["verdict"] == "paid":
        return f"asynchrony paid: {rates} ({_num(o['ratio'], '.2f')}x); {figures}"
    return (f"asynchrony did not pay in this run: {figures}; run.max_staleness: 0 would "
            f"likely be as fast ({rates})")


def _num(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) and math.isfinite(value) \
        else "-"


__all__ = ["PAY_MARGIN", "SOLO_SHARE", "Call", "Cover", "ModeFold", "OverlapFold", "host_now",
           "intersection", "measure", "overlap_figures", "overlap_with", "render", "union"]
