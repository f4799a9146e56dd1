"""Live settings: the meter, the steering task, and their resume.

The orchestrator's live :class:`~freshroll.control.Settings` are the admission limit (groups in
flight, the buffer's :attr:`~freshroll.kernel.buffer.SampleBuffer.admission_limit`; 0: none beyond
the freshness window), the requests each worker keeps in flight (``concurrency``) and the
number of active workers. Initially::

    static:    (rollout.max_inflight_groups or 0, rollout.worker_batch, rollout.workers)
    (worker_batch auto: RolloutSection.call_batch, the step's rollouts shared among the workers)
    adaptive:  (rollout.max_inflight_groups or limit_for(workers, concurrency), ...)  clamped

Every ``control.interval_s`` of the run's clock the steering task measures the window just
ended (:class:`Meter` -> :class:`~freshroll.control.Snapshot`), asks the controller
(``control.mode``: :class:`~freshroll.control.AdaptiveController` or
:class:`~freshroll.control.StaticController`), writes the decision to the ledger
(``controller_decided``: settings before and after, bottleneck, reason, the inputs and the
controller's state) and applies a change: pool resize (new workers added, the newest retired
gracefully), per-worker concurrency, admission limit; with the tail levers on
(:func:`tail_levers_on`: adaptive and ``tail.overprovision: auto``) also the extra requests
per admitted group and whether group deadlines cut (:mod:`freshroll.control.levers`).

What the meter measures in a window of length ``W``:

* ``trainer_wait_s``: time the trainer waited for a batch (a wait still going counts up to now);
  ``waited_samples``: for each step that had to wait, the samples missing when it first asked;
* ``blocked_s``: worker-seconds during which a worker had free slots and no queued request
  because admission was full (capacity 0), each second weighted by the share of its slots
  that were free (a continuous worker with 1 of 8 slots free is 1/8 blocked);
* ``worker_rates``: per active worker, completions per second it was up and not blocked;
* ``switch_cost_s``: the measured start-up time of the last workers (factory call);
* ``fed_rate``: samples per second the trainer ate while fed over its last
  :data:`FED_STEPS` steps (its demand ``D``, measured over whole steps; only with the tail
  levers on, so that a run without them decides exactly as before); ``generated`` in the
  window;
* ``consumed_samples``, ``completed`` (cumulative generated), ``in_flight`` (started and not
  yet rewarded: in a worker's slots or waiting for a reward; requests still queued are not
  counted, so "slots full" and the hard cut's drain read the slots), ``ready_samples``,
  ``version``, ``groups_accepted`` and ``groups_running`` (from the replayed buffer on
  resume), lag mean/max of the samples committed, and the discards by reason;
* the engines' own figures, from every active worker whose engine implements
  :class:`~freshroll.engines.seams.ReportsStats` (vLLM's scheduler, the simulated server):
  ``kv_cache_usage`` (the largest), ``engine_waiting`` and ``engine_running`` (sums, as of
  now) and ``preemptions`` (the growth of each engine's cumulative count since the last
  window; a new engine of a restarted worker counts from 0). None / 0 when no engine reports
  (the HF engine), so such a run's snapshots carry no engine signal.

Resume (``control.mode: adaptive``): the ledger's last ``controller_decided`` (replayed into
:attr:`~freshroll.kernel.state.BufferState.decision`) gives the settings and the controller state
to start from; the admission budget is recomputed from the replayed buffer's counts, never
reset. Static mode starts from the config in force.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from freshroll.config import Config
from freshroll.control.controller import (
    AdaptiveController,
    ControlConfig,
    Controller,
    ControllerState,
    Decision,
    Settings,
    Snapshot,
    StaticController,
)
from freshroll.engines.seams import EngineStats, ReportsStats
from freshroll.kernel.state import Lease
from freshroll.ledger import events as ev

if TYPE_CHECKING:
    from freshroll.pipeline.calls import Worker
    from freshroll.pipeline.context import PoolView, RewardBacklog, RunContext, SteeredPool
    from freshroll.pipeline.overprovision import Overprovision
    from freshroll.pipeline.tails import TailWatch

FED_STEPS = 3  # trainer steps the demand (Snapshot.fed_rate) is measured over


def control_config(cfg: Config) -> ControlConfig:
    """The controller's bounds from the ``control`` section (defaults from ``rollout``)."""
    c, ro = cfg.control, cfg.rollout
    return ControlConfig(
        group_size=ro.group_size, batch_groups=ro.batch_groups, min_workers=c.min_workers,
        max_workers=c.max_workers if c.max_workers is not None else max(ro.workers, c.min_workers),
        min_concurrency=c.min_concurrency,
        max_concurrency=(c.max_concurrency if c.max_concurrency is not None
                         else max(4 * ro.call_batch, c.min_concurrency)),
        idle_high=c.idle_high, idle_low=c.idle_low, blocked_high=c.blocked_high,
        up_cooldown_s=c.up_cooldown_s, down_cooldown_s=c.down_cooldown_s, kv_high=c.kv_high,
        max_extra=cfg.tail.max_extra if tail_levers_on(cfg) else 0,
    )


def tail_levers_on(cfg: Config) -> bool:
    """The controller moves the tail levers (over-provisioning, deadlines): adaptive mode
    with ``tail.overprovision: auto`` (freshroll.control.levers)."""
    return cfg.control.mode == "adaptive" and cfg.tail.overprovision == "auto"


@dataclass
class _Mark:
    t: float
    wait_s: float
    waited: int
    committed: int
    discards: dict[str, int]
    generated: int = 0


class Meter:
    """Cumulative counters the steering task reads a window from (ports: the run's context,
    a read view of the pool and the reward stage's backlog)."""

    def __init__(self, ctx: RunContext, pool: PoolView, rewards: RewardBacklog) -> None:
        self.ctx, self.buf, self.pool, self.rewards = ctx, ctx.buf, pool, rewards
        self.wait_total = 0.0
        self.waiting_since: float | None = None
        self.waited_samples = 0
        self.lags: list[int] = []
        self.levers = tail_levers_on(ctx.cfg)  # fed_rate is measured for them only (for now)
        self.fed_at = 0.0  # when the trainer last got its batch
        self.steps: deque[tuple[int, float]] = deque(maxlen=FED_STEPS)  # (samples, busy s)
        self._mark = self._now_mark(self.buf.clock.now())
        self._preempted: dict[str, tuple[object, int]] = {}  # worker -> (engine, count seen)
        self._reports: dict[str, tuple[object, bool]] = {}  # worker -> (engine, has stats())

    # -- fed by the trainer task -------------------------------------------------------------
    def trainer_waits(self, since: float, missing: int) -> None:
        self.waiting_since = since
        self.waited_samples += max(0, missing)

    def trainer_fed(self, wait_s: float) -> None:
        self.wait_total += wait_s
        self.waiting_since = None
        self.fed_at = self.buf.clock.now()

    def committed(self, lease: Lease) -> None:
        info = self.buf.sample_info
        self.lags.extend(lease.version - info(s)[1] for s in lease.samples)
        self.steps.append((len(lease.samples), self.buf.clock.now() - self.fed_at))

    def fed_rate(self) -> float:
        """Samples/s the trainer ate while fed, over its last :data:`FED_STEPS` steps (0:
        none yet): its demand, measured over whole steps (a window shorter than a step would
        see either no commit or a whole batch in a fraction of its time)."""
        busy = sum(b for _, b in self.steps)
        return sum(n for n, _ in self.steps) / busy if busy > 0 else 0.0

    # -- a window ----------------------------------------------------------------------------
    def _wait(self, now: float) -> float:
        since = self.waiting_since
        return self.wait_total + (0.0 if since is None else now - since)

    def _now_mark(self, now: float) -> _Mark:
        counts = self.buf.counts
        discards = {k[10:]: v for k, v in counts.items() if k.startswith("discarded_")}
        return _Mark(now, self._wait(now), self.waited_samples, counts["committed"], discards,
                     counts["generated"])

    def snapshot(self, now: float, settings: Settings) -> Snapshot:
        """The window since the last snapshot; starts the next one."""
        buf, pool, cfg = self.buf, self.pool, self.ctx.cfg
        last, mark = self._mark, self._now_mark(now)
        window = max(0.0, now - last.t)
        blocked, rates, in_flight, t0 = 0.0, [], self.rewards.pending, last.t
        for active, workers in ((True, pool.active), (False, pool.leaving)):
            for w in workers.values():
                in_flight += w.inflight
                ready = w.ready_at
                if ready is None:
                    continue
                since = w.blocked_since
                b = w.blocked_s + (0.0 if since is None else (now - since) * w.blocked_share)
                if w.mark_epoch != w.epoch:  # a new epoch: its window starts from nothing
                    w.mark_epoch, w.mark_done, w.mark_blocked = w.epoch, 0, 0.0
                db, dn = b - w.mark_blocked, w.done - w.mark_done
                w.mark_done, w.mark_blocked = w.done, b
                blocked += db
                if active:
                    up = now - (ready if ready > t0 else t0) - db
                    if up > 0:
                        rates.append(dn / up)
        self._mark = mark
        engine = self._engines(pool.active)
        counts = buf.counts
        lags, self.lags = self.lags, []
        startups = pool.startups[-8:]
        assert buf.version is not None
        return Snapshot(
            now=now, window_s=window, settings=settings,
            consumed_samples=mark.committed - last.committed,
            trainer_wait_s=min(window, mark.wait_s - last.wait_s),
            waited_samples=mark.waited - last.waited, blocked_s=blocked,
            worker_rates=tuple(rates),
            switch_cost_s=sum(startups) / len(startups) if startups else 0.0,
            completed=counts["generated"], in_flight=in_flight,
            ready_samples=buf.ready_groups() * cfg.rollout.group_size,
            version=buf.version.step, max_staleness=cfg.run.max_staleness,
            batch_groups=cfg.rollout.batch_groups, admission_window=cfg.run.window_steps,
            groups_accepted=buf.accepted,
            groups_running=buf.running,
            lag_mean=sum(lags) / len(lags) if lags else 0.0, lag_max=max(lags, default=0),
            discards={k: v - last.discards.get(k, 0) for k, v in mark.discards.items()
                      if v - last.discards.get(k, 0)},
            fed_rate=self.fed_rate() if self.levers else 0.0,
            generated=mark.generated - last.generated,
            **engine,
        )

    def _engines(self, active: Mapping[str, Worker]) -> dict[str, Any]:
        """The Snapshot's engine fields from the active workers' engines that report."""
        reports: list[EngineStats] = []
        preempted, seen = 0, self._preempted
        for name, w in active.items():
            engine = w.engine
            known = self._reports.get(name)
            if known is None or known[0] is not engine:  # a Protocol check is slow: once
                known = self._reports[name] = (engine, isinstance(engine, ReportsStats))
            if not known[1]:
                continue
            st = cast(ReportsStats, engine).stats()
            if not isinstance(st, EngineStats):  # None: no report yet
                continue
            reports.append(st)
            was_engine, was = seen.get(name, (None, 0))
            base = was if was_engine is engine else 0  # a new engine counts from 0
            preempted += max(0, st.preemptions - base)
            seen[name] = (engine, st.preemptions)
        if not reports:
            return {}
        return {
            "kv_cache_usage": max(min(1.0, max(0.0, r.kv_cache_usage)) for r in reports),
            "engine_waiting": sum(r.waiting for r in reports),
            "engine_running": sum(r.running for r in reports), "preemptions": preempted,
        }


class Steering:
    """The live settings of one pipeline and the task that steers them.

    Ports: the run's context, the pool it resizes (:class:`SteeredPool`), the reward stage's
    backlog (the meter's), and the tail levers it moves: the over-provisioning's ``live``
    extra requests and the deadline watch's ``enabled`` (None: no tails task).
    ``controller``: None builds the one ``control.mode`` names."""

    def __init__(self, ctx: RunContext, pool: SteeredPool, rewards: RewardBacklog,
                 overprov: Overprovision, deadlines: TailWatch | None,
                 controller: Controller | None = None) -> None:
        self.ctx, self.buf, cfg = ctx, ctx.buf, ctx.cfg
        self.pool, self.overprov, self.deadlines = pool, overprov, deadlines
        self.config = control_config(cfg)
        self.mode = cfg.control.mode
        self.controller: Controller = controller or (
            AdaptiveController(self.config) if self.mode == "adaptive"
            else StaticController(self.config))
        self.state = ControllerState()
        self.meter = Meter(ctx, pool, rewards)
        self.settings = Settings(0, cfg.rollout.call_batch, cfg.rollout.workers)
        self.decisions: list[Decision] = []

    def initial(self) -> Settings:
        """The settings to start from (module docstring); on resume, the last decision's."""
        ro = self.ctx.cfg.rollout
        if self.mode != "adaptive":
            return Settings(ro.max_inflight_groups or 0, ro.call_batch, ro.workers)
        last = self.buf.decision
        if last is not None and last.mode == "adaptive":
            was = last.settings
            self.state = ControllerState.from_record(last.state)
            kept = self.config.clamp(Settings(was.admission_limit, was.concurrency, was.workers,
                                              was.extra, was.deadline))
            return replace(kept, admission_limit=was.admission_limit)
        s = self.config.clamp(Settings(0, ro.call_batch, ro.workers))
        return Settings(ro.max_inflight_groups or s.admission_limit, s.concurrency, s.workers)

    def apply(self, s: Settings) -> None:
        """Make ``s`` the live settings: admission limit, per-worker concurrency, pool size."""
        pool = self.pool
        self.buf.admission_limit = s.admission_limit or None
        pool.set_concurrency(s.concurrency)
        pool.resize(s.workers)
        if self.config.max_extra > 0:  # the tail levers (control/levers.py)
            self.overprov.live = s.extra
            if self.deadlines is not None:
                self.deadlines.enabled = self.ctx.cfg.tail.deadline or s.deadline
        self.settings = s
        self.ctx.notify()

    async def run(self) -> None:
        interval = self.ctx.cfg.control.interval_s
        while True:
            await asyncio.sleep(interval)
            self.step()

    def step(self) -> Decision:
        """Measure the window, decide, record, apply."""
        now = self.buf.clock.now()
        d = self.controller.decide(self.meter.snapshot(now, self.settings), self.state)
        rec = d.record()
        rec["inputs"]["lag_mean"] = _finite(rec["inputs"]["lag_mean"])
        self.buf.record(ev.ControllerDecided(
            ts=now, mode=self.mode, previous=ev.LiveSettings(**asdict(d.previous)),
            settings=ev.LiveSettings(**asdict(d.settings)), bottleneck=d.bottleneck,
            reason=d.reason, inputs=rec["inputs"], state=rec["state"],
        ))
        self.state = d.state
        self.decisions.append(d)
        if d.settings != self.settings:
            self.apply(d.settings)
        return d


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


__all__ = ["Meter", "Steering", "control_config", "tail_levers_on"]
