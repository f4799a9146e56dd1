"""The controller: admission, per-worker concurrency and worker count from a measured snapshot.

Pure, like :mod:`freshroll.kernel.freshness`: a :class:`Snapshot` of one measuring
window, the previous :class:`ControllerState` and a :class:`ControlConfig` in,
a :class:`Decision` out (new :class:`Settings`, new state, the inputs used and
a reason a person can read). No I/O, no clock: ``Snapshot.now`` is the time.

Signals of one window of length ``W`` (``n`` active workers, ``c`` requests per worker)::

    ω = trainer_wait_s / W                      trainer idle ratio (wait ÷ wall)
    β = blocked_s / (n × W)                     producer backpressure: worker time blocked
                                                by admission (no request to start)
    p = median(worker_rates)                    samples/s of one worker while not blocked
    D = fed_rate (none: consumed / (W − wait))  trainer demand: samples/s eaten when fed
    κ = max over workers of kv_cache_usage      the engines' KV cache in use (None: no
                                                engine reports: the HF engine)
    π = preemptions in the window (sum)         sequences the engines evicted and recompute
    q = engine_waiting (sum)                    sequences queued inside the engines

**Bottleneck.** producer-bound if ω ≥ idle_high; trainer-bound if β ≥ blocked_high or (η > 0
and lag_mean > lag_soft × η), and ω < idle_low; both ω ≥ idle_high and β ≥ blocked_high at
once is a *conflict*: a measurement fault, or an admission window that serializes the
pipeline (η too small, stragglers holding groups): :mod:`freshroll.control.levers` then;
for ``down_cooldown_s`` after one, no scale-down and no hard cut (its ``window_bound``).

**Workers** (asymmetric hysteresis, benefit against the measured switch cost)::

    n* = ceil(D × (1 + headroom) / p)                               target, clamped [min, max]
    up   : producer-bound, waited_samples > 0, n* > n, up cooldown passed since the last up
           k = min(n* − n, max_up_step)    (no D yet: k = max(1, ceil(n / 2)))
           gain = D(1+headroom)/p − n      (workers' worth of production the trainer lacks)
    down : trainer-bound, surplus s = n×p − D×(1+headroom), spare = s/p − down_margin ≥ 1,
           k = min(floor(spare), ceil(spare × down_gain), max_down_step, n − min_workers),
           gain = k; the down cooldown passed since the last switch either way
    (up closes the whole deficit at once, even right after a down; down removes a share
    of the surplus per longer cooldown: down_cooldown_s ≥ up_cooldown_s, idle_low < idle_high)
    only if   H × min(k, gain) > k × switch_cost_s           (worker-seconds)
              H = min(horizon_s, now − last switch): a regime is expected to last as
              long as the last one did, so flip-flopping makes every switch dearer.

At the settled ``n = ceil(D(1+h)/p)`` the surplus is below one worker, so neither
rule fires: the dead band is one worker plus ``down_margin`` wide.

**Concurrency** (AIMD, one decision per pool turnover: ``n × c`` completions
since the last one)::

    memory cut : π > 0 (whatever the bottleneck: the engine is past its memory knee, and
                 recomputing evicted sequences costs throughput on every side)
                 -> c = max(c_min, floor(c × hard_factor)), ceiling = c − 1, latched as
                 the hard cut; it needs no pool turnover (preemption is direct evidence)
    hard cut   : stale discards in the window, trainer-bound or balanced, not window-bound
                 (else stale samples are stragglers, not over-production: no cut)
                 -> c = max(c_min, floor(c × hard_factor)),
                 ceiling = c − 1, latched (no change at all) until in_flight <= n × c:
                 the stale samples seen after a cut were started before it, so they must
                 not cut again; after the drain the next decision waits a full turnover
    probe check: after c0 -> c1, p1/p0 − 1 + 2√2 × se < gain_min × (c1/c0 − 1)
                 -> back to c0, ceiling = c0 (the engine is saturated; decode t0 + t1×active
                 has its knee at a fixed concurrency, independent of response length);
                 se = 1.2533 σ(rates) / (√n × p), the median's relative standard error, so
                 a probe is only judged a failure when the measurement can tell
    no trim    : trainer-bound at min_workers, c is kept: the admission limit already sheds
                 the surplus (a blocked worker costs nothing more), and a smaller batch
                 costs more per row (embedded default, 3 seeds: a trim 128 -> 112 made the
                 colocated generator 33% busier and the run 11% slower, docs/control.md)
    increase   : slots full (in_flight >= n × c), c < ceiling, and producer-bound, or
                 balanced / trainer-bound with n' > min_workers and lag below lag_soft × η
                 -> c + 1   (n' the new worker count)
                 refused while κ >= kv_high (the engine is at its memory knee: one more
                 sequence each would preempt) or q > 0 (the engines already hold more
                 requests than they run: more only queues)

Cost is worker-seconds, and a worker costs the same at any concurrency, so each
worker should run at the knee: below it, surplus production is shed by removing
workers, and concurrency keeps probing up while workers can still be consolidated;
lowering c only pays where freshness demands it (the hard cut) or memory does (the
memory cut): at min_workers the admission limit sheds the surplus.

**Admission.** ``admission_limit`` caps the groups in flight (the buffer's
``free_slots``): ``max(B, ceil(n × c × (1 + admission_slack) / group_size))``, never below
one trainer batch (below it admission serializes the pipeline), and enough to
keep every slot fed while stragglers still hold their group. It never widens
the freshness bound: :func:`admission_budget` is
:func:`freshroll.kernel.freshness.admission_capacity` with ``free_slots = limit − running``.
The budget is recomputed from the snapshot's counts each time (after a resume: the replayed
ledger's), never reset to ``(η + v + 1) × B`` nor counting re-issued work twice (AReaL issue
#1388). The controller's state travels in every decision record (:meth:`Decision.record`,
:meth:`ControllerState.from_record`): a resumed run keeps its cooldowns, latch and ceiling;
a clock that went back restarts the cooldowns, never blocks them.

Signals recorded but read by no rule, and the engine rules' order: docs/control.md.

:class:`StaticController` never changes a setting (for comparison); it still
reports the bottleneck. Long tails: :mod:`freshroll.control.tail`, :mod:`freshroll.control.levers`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

from freshroll.control.levers import steer_window, window_bound
from freshroll.errors import ConfigError
from freshroll.kernel.freshness import admission_capacity

Bottleneck = Literal["producer", "trainer", "balanced", "conflict", "unknown"]


@dataclass(frozen=True, slots=True)
class Settings:
    """What the controller sets: groups in flight, requests per worker, active workers."""

    admission_limit: int
    concurrency: int
    workers: int
    extra: int = 0  # over-provisioning: extra requests per group (control/levers.py)
    deadline: bool = False  # group deadlines on (control/levers.py)


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """Bounds and gains (validated; every bound is inclusive)."""

    group_size: int
    min_workers: int = 1
    max_workers: int = 1
    min_concurrency: int = 1
    max_concurrency: int = 64
    idle_high: float = 0.03
    idle_low: float = 0.01
    blocked_high: float = 0.10
    lag_soft: float = 0.5
    headroom: float = 0.05
    down_margin: float = 0.25
    max_up_step: int = 1 << 30
    max_down_step: int = 1 << 30
    down_gain: float = 0.5
    up_cooldown_s: float = 5.0
    down_cooldown_s: float = 30.0
    horizon_s: float = 120.0
    gain_min: float = 0.25
    hard_factor: float = 0.5
    admission_slack: float = 0.5
    kv_high: float = 0.95  # KV cache usage at which concurrency stops growing
    batch_groups: int = 1  # B: the admission limit never goes below one trainer batch
    max_extra: int = 0  # the tail levers' bound (0: off; control_levers)
    chi_high: float = 0.25  # cancelled share above which extras come down
    lever_cooldown_s: float = 20.0  # seconds between two moves of the tail levers

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"control: {what}")
        need(self.group_size >= 1, f"group_size must be >= 1, got {self.group_size}")
        need(self.batch_groups >= 1, f"batch_groups must be >= 1, got {self.batch_groups}")
        need(1 <= self.min_workers <= self.max_workers,
             f"need 1 <= min_workers <= max_workers, got {self.min_workers}, {self.max_workers}")
        need(1 <= self.min_concurrency <= self.max_concurrency,
             "need 1 <= min_concurrency <= max_concurrency, "
             f"got {self.min_concurrency}, {self.max_concurrency}")
        need(0.0 <= self.idle_low < self.idle_high <= 1.0,
             f"need 0 <= idle_low < idle_high <= 1, got {self.idle_low}, {self.idle_high}")
        need(0.0 < self.blocked_high <= 1.0,
             f"blocked_high must be in (0, 1], got {self.blocked_high}")
        need(self.max_up_step >= 1 and self.max_down_step >= 1, "max_up_step, max_down_step >= 1")
        need(0.0 <= self.up_cooldown_s <= self.down_cooldown_s,
             f"need 0 <= up_cooldown_s <= down_cooldown_s, got {self.up_cooldown_s}, "
             f"{self.down_cooldown_s}")
        need(0.0 < self.hard_factor < 1.0, f"hard_factor must be in (0, 1), got {self.hard_factor}")
        need(0.0 < self.down_gain <= 1.0, f"down_gain must be in (0, 1], got {self.down_gain}")
        need(0.0 < self.kv_high <= 1.0, f"kv_high must be in (0, 1], got {self.kv_high}")
        for name in ("lag_soft", "headroom", "down_margin", "horizon_s", "gain_min",
                     "admission_slack", "chi_high", "lever_cooldown_s", "max_extra"):
            need(getattr(self, name) >= 0.0, f"{name} must be >= 0, got {getattr(self, name)}")

    def clamp(self, s: Settings) -> Settings:
        """``s`` with workers and concurrency inside their bounds and the matching limit."""
        n = min(max(s.workers, self.min_workers), self.max_workers)
        c = min(max(s.concurrency, self.min_concurrency), self.max_concurrency)
        return Settings(self.limit_for(n, c), c, n, min(max(s.extra, 0), self.max_extra),
                        s.deadline and self.max_extra > 0)

    def limit_for(self, workers: int, concurrency: int) -> int:
        slots = workers * concurrency * (1 + self.admission_slack)
        return max(self.batch_groups, math.ceil(slots / self.group_size))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the orchestrator measured over the last window (counts in the window
    unless named cumulative)."""

    now: float
    window_s: float
    settings: Settings
    consumed_samples: int = 0          # committed by the trainer
    trainer_wait_s: float = 0.0        # the trainer waited for a batch
    waited_samples: int = 0            # samples missing when the trainer asked (sum over steps)
    blocked_s: float = 0.0             # worker-seconds blocked by admission
    worker_rates: tuple[float, ...] = ()  # per active worker: samples / unblocked second
    switch_cost_s: float = 0.0         # measured worker-seconds lost per worker switch
    completed: int = 0                 # cumulative requests completed (pool turnover)
    in_flight: int = 0                 # requests queued, running or generated
    ready_samples: int = 0             # buffer depth
    version: int = 0                   # trainer policy step v
    max_staleness: int = 0             # η
    batch_groups: int = 1              # B
    admission_window: int | None = None  # W in trainer steps (run.admission_window); None: η + 1
    groups_accepted: int = 0           # cumulative, from the (replayed) buffer
    groups_running: int = 0
    lag_mean: float = 0.0
    lag_max: int = 0
    discards: Mapping[str, int] = field(default_factory=dict)
    # what the engines report (engines.seams.ReportsStats); None / 0: no engine reports
    kv_cache_usage: float | None = None  # max over active workers, 0..1
    engine_waiting: int = 0            # sum: sequences queued inside the engines
    engine_running: int = 0            # sum: sequences the engines generate now
    preemptions: int = 0               # in the window, summed over active workers
    fed_rate: float = 0.0              # samples/s of the trainer's recent steps while fed
    generated: int = 0                 # requests generated in the window


@dataclass(frozen=True, slots=True)
class ControllerState:
    """What the controller remembers between decisions (JSON-ready; resumes from a record)."""

    last_up_at: float | None = None
    last_down_at: float | None = None
    turnover_mark: int = 0                 # Snapshot.completed at the last concurrency decision
    probe: tuple[int, float] | None = None  # (c0, p0) before the last additive increase
    ceiling: int | None = None
    latched: bool = False
    last_lever_at: float | None = None     # the tail levers' last move
    demand_ref: float | None = None        # the lowest trainer demand seen (control/levers.py)
    last_conflict_at: float | None = None  # the last window-bound (conflict) reading

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ControllerState:
        probe = record.get("probe")
        return cls(
            last_up_at=record.get("last_up_at"), last_down_at=record.get("last_down_at"),
            turnover_mark=int(record.get("turnover_mark", 0)),
            probe=None if probe is None else (int(probe[0]), float(probe[1])),
            ceiling=record.get("ceiling"), latched=bool(record.get("latched", False)),
            last_lever_at=record.get("last_lever_at"), demand_ref=record.get("demand_ref"),
            last_conflict_at=record.get("last_conflict_at"),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision: the settings before and after, why, and everything it read."""

    at: float
    previous: Settings
    settings: Settings
    state: ControllerState
    bottleneck: Bottleneck
    reason: str
    inputs: Snapshot

    @property
    def changed(self) -> bool:
        return self.settings != self.previous

    def record(self) -> dict[str, Any]:
        """JSON-ready form (the body of a future ``controller_decided`` ledger event)."""
        rates = tuple(r if math.isfinite(r) else 0.0 for r in self.inputs.worker_rates)
        inputs = replace(self.inputs, discards=dict(self.inputs.discards), worker_rates=rates)
        return asdict(replace(self, inputs=inputs))


def admission_budget(snap: Snapshot, settings: Settings) -> int:
    """Groups that may be admitted now: the freshness budget under the controller's cap."""
    return admission_capacity(
        max_staleness=snap.max_staleness, version=snap.version, batch_groups=snap.batch_groups,
        accepted=snap.groups_accepted, running=snap.groups_running,
        free_slots=settings.admission_limit - snap.groups_running,
        admission_window=snap.admission_window,
    )


def _rates(snap: Snapshot) -> list[float]:
    return [r for r in snap.worker_rates if r > 0 and math.isfinite(r)]


def _rate(snap: Snapshot) -> float:
    rates = _rates(snap)
    return statistics.median(rates) if rates else 0.0


def _rate_error(snap: Snapshot) -> float:
    """Relative standard error of the median rate (1.2533 σ / √n; 0 with one worker)."""
    rates = _rates(snap)
    if len(rates) < 2:
        return 0.0
    return 1.2533 * statistics.stdev(rates) / math.sqrt(len(rates)) / statistics.median(rates)


def _demand(snap: Snapshot) -> float | None:
    if snap.fed_rate > 0:  # measured over whole steps: a window shorter than a step is biased
        return snap.fed_rate
    busy = snap.window_s - snap.trainer_wait_s
    if snap.consumed_samples <= 0 or busy <= 0:
        return None
    return snap.consumed_samples / busy


def bottleneck(snap: Snapshot, cfg: ControlConfig) -> tuple[Bottleneck, float, float]:
    """``(which side limits, ω, β)`` for one window."""
    if snap.window_s <= 0 or snap.settings.workers <= 0:
        return "unknown", 0.0, 0.0
    omega = min(1.0, max(0.0, snap.trainer_wait_s / snap.window_s))
    beta = min(1.0, max(0.0, snap.blocked_s / (snap.settings.workers * snap.window_s)))
    eta = snap.max_staleness
    laggy = eta > 0 and snap.lag_mean > cfg.lag_soft * eta
    if omega >= cfg.idle_high and beta >= cfg.blocked_high:
        return "conflict", omega, beta
    if omega >= cfg.idle_high:
        return "producer", omega, beta
    if omega < cfg.idle_low and (beta >= cfg.blocked_high or laggy):
        return "trainer", omega, beta
    return "balanced", omega, beta


def _since(now: float, t: float | None) -> float:
    return math.inf if t is None else now - t


def _workers(
    snap: Snapshot, st: ControllerState, cfg: ControlConfig, side: Bottleneck,
) -> tuple[int, ControllerState, str]:
    n, now, p, demand = snap.settings.workers, snap.now, _rate(snap), _demand(snap)
    last = max((t for t in (st.last_up_at, st.last_down_at) if t is not None), default=None)
    horizon, cost = min(cfg.horizon_s, _since(now, last)), snap.switch_cost_s
    if side == "producer":
        if snap.waited_samples <= 0:
            return n, st, "the trainer waited, but on no samples: workers kept"
        if _since(now, st.last_up_at) < cfg.up_cooldown_s:
            return n, st, "scale-up cooling down"
        if demand is None or p <= 0:  # nothing consumed yet: grow by half
            target, gain = n + max(1, math.ceil(n / 2)), math.inf
        else:
            need = min(demand * (1 + cfg.headroom) / p, float(cfg.max_workers))
            target, gain = math.ceil(need), need - n
        k = min(min(target, cfg.max_workers) - n, cfg.max_up_step)
        if k <= 0:
            return n, st, "at max_workers" if n >= cfg.max_workers else "enough workers"
        benefit = horizon * min(k, gain)
        if benefit <= k * cost:
            return n, st, f"+{k} not worth it: benefit {benefit:.1f} <= cost {k * cost:.1f} w-s"
        why = f"+{k} workers: the trainer waited on {snap.waited_samples} samples"
        return n + k, replace(st, last_up_at=now), why
    if side == "trainer" and demand is not None and p > 0:
        if window_bound(st.last_conflict_at, cfg.down_cooldown_s, now):
            return n, st, "window-bound within the down cooldown: workers kept"
        if min(_since(now, st.last_down_at), _since(now, st.last_up_at)) < cfg.down_cooldown_s:
            return n, st, "scale-down cooling down"
        surplus = n * p - demand * (1 + cfg.headroom)
        spare = min(surplus / p - cfg.down_margin, float(n))
        k = min(math.floor(spare), math.ceil(spare * cfg.down_gain), cfg.max_down_step,
                n - cfg.min_workers) if spare >= 1 else 0
        if k <= 0:
            return n, st, "surplus below one worker" if n > cfg.min_workers else "at min_workers"
        if horizon <= cost:
            return n, st, f"-{k} not worth it: benefit {horizon * k:.1f} <= cost {k * cost:.1f} w-s"
        why = f"-{k} workers: surplus {surplus:.2f} samples/s"
        return n - k, replace(st, last_down_at=now), why
    return n, st, "workers kept"


def _concurrency(
    snap: Snapshot, st: ControllerState, cfg: ControlConfig, side: Bottleneck, workers: int,
) -> tuple[int, ControllerState, str]:
    s = snap.settings
    c, pool = s.concurrency, s.workers * s.concurrency
    if st.latched:
        if snap.in_flight > pool:
            return c, st, f"hard cut latched: {snap.in_flight} in flight > {pool}"
        return c, replace(st, latched=False, turnover_mark=snap.completed), "hard cut drained"
    if snap.preemptions > 0:
        cut = max(cfg.min_concurrency, math.floor(c * cfg.hard_factor))
        st = replace(st, probe=None, ceiling=max(cfg.min_concurrency, c - 1),
                     latched=snap.in_flight > s.workers * cut, turnover_mark=snap.completed)
        return cut, st, f"memory cut {c}->{cut}: {snap.preemptions} preemptions{_kv(snap)}"
    if snap.completed - st.turnover_mark < max(1, pool):
        return c, st, "concurrency: pool not turned over"
    st = replace(st, turnover_mark=snap.completed)
    stale = snap.discards.get("stale", 0)
    if stale > 0 and side in ("trainer", "balanced"):
        if window_bound(st.last_conflict_at, cfg.down_cooldown_s, snap.now):
            return c, st, f"concurrency kept: {stale} stale, stragglers (window-bound)"
        cut = max(cfg.min_concurrency, math.floor(c * cfg.hard_factor))
        st = replace(st, probe=None, ceiling=max(cfg.min_concurrency, c - 1),
                     latched=snap.in_flight > s.workers * cut)
        return cut, st, f"hard cut {c}->{cut}: {stale} stale discards"
    p = _rate(snap)
    if st.probe is not None:
        c0, p0 = st.probe
        st = replace(st, probe=None)
        gain = p / p0 - 1 if p0 > 0 else 0.0
        noise = 2 * math.sqrt(2) * _rate_error(snap)  # two standard errors of a difference
        if c > c0 and gain + noise < cfg.gain_min * (c / c0 - 1):
            why = f"gain {gain:+.1%} too small"
            return c0, replace(st, ceiling=c0), f"concurrency {c}->{c0}: {why}"
    eta = snap.max_staleness
    top = cfg.max_concurrency if st.ceiling is None else min(cfg.max_concurrency, st.ceiling)
    laggy = eta > 0 and snap.lag_mean > cfg.lag_soft * eta
    grow = side == "producer" or (side in ("balanced", "trainer") and workers > cfg.min_workers
                                  and not laggy)
    if grow and snap.in_flight >= pool and c < top:
        kv = snap.kv_cache_usage
        if kv is not None and kv >= cfg.kv_high:
            return c, st, f"concurrency kept: kv cache {kv:.1%} >= kv_high {cfg.kv_high:.0%}"
        if snap.engine_waiting > 0:
            return c, st, f"concurrency kept: {snap.engine_waiting} waiting in the engines"
        why = "slots full" if side == "producer" else "consolidate onto fewer workers"
        return c + 1, replace(st, probe=(c, p)), f"concurrency {c}->{c + 1}: {why}"
    return c, st, "concurrency kept"


def _kv(snap: Snapshot) -> str:
    return "" if snap.kv_cache_usage is None else f", kv cache {snap.kv_cache_usage:.1%}"


def _engine(snap: Snapshot) -> str:
    """The engines' signals for the reason's head ("" when no engine reports)."""
    kv = snap.kv_cache_usage
    if kv is None:
        return ""
    return (f", kv {kv:.1%}, {snap.preemptions} preempted, {snap.engine_waiting} waiting / "
            f"{snap.engine_running} running in the engines")


def _rewind(t: float | None, now: float) -> Any:  # Any: spread into replace() by name
    return None if t is None else min(t, now)


def decide(snap: Snapshot, state: ControllerState, cfg: ControlConfig) -> Decision:
    """The controller's rules (module docstring) applied to one snapshot."""
    now = snap.now  # a clock that went back restarts the cooldowns, never blocks them
    state = replace(state, **{t: _rewind(getattr(state, t), now) for t in (
        "last_up_at", "last_down_at", "last_lever_at", "last_conflict_at")})
    cur = replace(snap, settings=cfg.clamp(snap.settings))
    side, omega, beta = bottleneck(cur, cfg)
    head = f"{side}-bound" if side in ("producer", "trainer") else side
    if side == "conflict":
        head = ("conflict: the trainer waits AND producers are blocked: a measurement fault, or "
                "admission serializes the pipeline (eta too small, stragglers holding groups)")
    n, state, why_n = _workers(cur, state, cfg, side)
    w = steer_window(side, cur, n, why_n, cfg, state.demand_ref, now=now,
                     last=(state.last_up_at, state.last_down_at, state.last_lever_at))
    state = replace(state, last_down_at=w.last_down, last_up_at=w.last_up,
                    last_lever_at=w.last_lever, demand_ref=w.demand_ref)
    c, state, why_c = _concurrency(cur, state, cfg, side, w.workers)
    if side == "conflict":
        state = replace(state, last_conflict_at=now)
    new = cfg.clamp(Settings(0, c, w.workers, w.levers.extra, w.levers.deadline))
    reason = (f"{head} (idle {omega:.1%}, blocked {beta:.1%}{_engine(cur)}); {w.why_workers}; "
              f"{why_c}" + (f"; {w.why_levers}" if w.why_levers else ""))
    return Decision(at=now, previous=snap.settings, settings=new, state=state,
                    bottleneck=side, reason=reason, inputs=snap)


class Controller(Protocol):
    def decide(self, snap: Snapshot, state: ControllerState) -> Decision: ...


@dataclass(frozen=True, slots=True)
class AdaptiveController:
    """:func:`decide` with a fixed config."""

    config: ControlConfig

    def decide(self, snap: Snapshot, state: ControllerState) -> Decision:
        return decide(snap, state, self.config)


@dataclass(frozen=True, slots=True)
class StaticController:
    """Keeps the settings it is given, exactly (a hand-tuned admission limit too): the
    baseline the controller is compared to. It still reads the bottleneck."""

    config: ControlConfig

    def decide(self, snap: Snapshot, state: ControllerState) -> Decision:
        side, omega, beta = bottleneck(snap, self.config)
        reason = f"static ({side}; idle {omega:.1%}, blocked {beta:.1%}{_engine(snap)})"
        return Decision(at=snap.now, previous=snap.settings, settings=snap.settings, state=state,
                        bottleneck=side, reason=reason, inputs=snap)
