"""The sync fallback: measure both modes inside one async run and keep the faster one.

An async run's overlap can vanish (another process takes a core, the stages take turns on
one interpreter's GIL): it is then no faster than a synchronous run and still pays for
staleness. :mod:`freshroll.figures.overlap` *estimates* this after the run; this module
*measures* it during the run, under the same load, and acts on it. Pure: a
:class:`FallbackProbe` is fed the time of each committed step and answers with a
:class:`Switch` when the look-ahead must change; no I/O, no clock of its own.

**Look-ahead.** Admission lets groups be generated up to ``lookahead`` policy versions ahead
of the trainer (:func:`freshroll.kernel.freshness.admission_capacity` with ``lookahead`` in place of
``max_staleness``): ``max_staleness`` is the async mode, 0 the sync mode (a batch is
generated only by the current policy, while the trainer waits). A look-ahead never exceeds
``max_staleness``, so the freshness bound that ``verify`` checks holds in both modes and a
sync window only lowers the lag.

**One probe** (the first after ``warmup_steps``; the next ``max(every_s, hold_factor x``
the last probe's length) seconds of the run's clock after a choice)::

    measure the current mode     >= window_steps steps and >= window_s seconds  -> r_cur
    switch to the other mode     settle: max_staleness + 1 steps (the batches generated
                                 ahead are drained) going to sync, 1 step going to async
    measure the other mode       >= window_steps steps and >= window_s seconds  -> r_other
    choose                       async if r_async > (1 + margin) x r_sync, else sync

with ``r = rollouts per step x steps / seconds`` between commits (accepted rollouts/s: every
step consumes one batch). Ties go to sync: when asynchrony does not pay it only adds policy
lag. Each switch and each choice is a ``mode_decided`` ledger event with the rates measured,
so the summary's verdict and ``verify`` read the measurement, not an estimate.

Cost: a probe spends one window in the slower mode, and the hold between probes is at
least ``hold_factor`` (20) probes long: under 3% of a run when the modes differ by 2x,
however long a step is. A run that ends during a probe ends in the mode it was measuring;
one shorter than ``warmup_steps`` plus a window never leaves the async mode.

**Learning, not only rate** (``kl_risk``; ``control.fallback_kl_risk``): every committed step
that trained on a stale sample (its ``lag_mean`` > 0) feeds its ``mismatch_kl`` (behaviour vs
proximal policy, k3) to a window of the last ``window_steps`` such steps. When the window is
full and its mean is above ``kl_risk`` while the run is in the async mode, the policy moved
far from the one that sampled its batches: the run falls back to sync at once (a ``chose``
switch whose reason, ``learning: ...``, names the figure) and holds it until the next
probe, ``every_s`` later; a probe whose async window ends above ``kl_risk`` chooses sync
whatever the rates. This is
the run's "at risk" line (:mod:`freshroll.figures.learning`, ``KL_RISK``) acted on: faster
steps that teach less are not what asynchrony is for.

**A start that is an estimate** (:class:`EarlierChoice` with ``hold`` False: the thread
probe's reading for Ray's actors, measured in this process and not through their round
trips): the run starts in that mode and probes right after the warm-up, as an async start
does.

**An earlier run's choice** (:class:`EarlierChoice`, from
:mod:`freshroll.placement.probe_cache`: the same work at a like load, its last choice kept at
its end): the run starts in that mode, recorded as a choice at step 0 whose reason says so,
and holds it as a choice made at its first commit (the next probe ``every_s`` later); no
warm-up, no first probe. A probe later in the run measures afresh, and its choice is the one
kept for the next run: the speed answer (async where it pays), never a fallback for learning,
which is the late state of one run (its stale steps' KL), not a property of the work (kept, a
seed sweep ran every seed after the first sync from its first step).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from freshroll.engines.specs import engine_spec

if TYPE_CHECKING:
    from freshroll.config import Config

Mode = Literal["async", "sync"]
Phase = Literal["warmup", "hold", "measure", "settle", "measure_other"]


@dataclass(frozen=True, slots=True)
class FallbackConfig:
    """Probe windows and margins (``control.fallback_*``)."""

    max_staleness: int
    rollouts_per_step: int
    window_steps: int = 8
    window_s: float = 0.5
    every_s: float = 60.0
    warmup_steps: int = 4
    margin: float = 0.05
    #: the next probe waits at least this many times the last probe's length
    hold_factor: float = 20.0
    #: the stale steps' mean mismatch KL above which async falls back to sync (None: off)
    kl_risk: float | None = None

    def __post_init__(self) -> None:
        if self.max_staleness < 1:
            raise ValueError("the sync fallback needs an async run (max_staleness >= 1)")
        if self.rollouts_per_step < 1 or self.window_steps < 1 or self.warmup_steps < 0:
            raise ValueError("rollouts_per_step and window_steps must be >= 1, "
                             "warmup_steps >= 0")
        if not (self.window_s >= 0 and self.every_s > 0 and self.margin >= 0
                and self.hold_factor >= 0):
            raise ValueError("window_s, margin and hold_factor must be >= 0, every_s > 0")
        if self.kl_risk is not None and not self.kl_risk > 0:
            raise ValueError("kl_risk must be > 0 (None: off)")

    def lookahead(self, mode: Mode) -> int:
        return self.max_staleness if mode == "async" else 0


@dataclass(frozen=True, slots=True)
class Switch:
    """What the orchestrator applies (look-ahead) and records (``mode_decided``)."""

    step: int
    mode: Mode
    lookahead: int
    phase: Literal["probe", "chose"]
    reason: str
    async_per_s: float | None = None
    sync_per_s: float | None = None
    #: the mode the run starts in (:meth:`FallbackProbe.reuse`), not a choice made during it
    start: bool = False


@dataclass(frozen=True, slots=True)
class EarlierChoice:
    """A choice an earlier run of the same work made (module doc): its mode and the rates
    it was chosen on, and when (unix time)."""

    mode: Mode
    async_per_s: float | None
    sync_per_s: float | None
    measured_at: float
    #: the reason recorded, where the start is not an earlier run's measured choice (the
    #: thread probe's: threads pay, so the stages take turns on all the cores)
    why: str = ""
    #: held as a choice until ``every_s`` has passed (True), or an estimate the run checks
    #: on its own steps at once: its first probe right after the warm-up (False)
    hold: bool = True


def _other(mode: Mode) -> Mode:
    return "sync" if mode == "async" else "async"


class FallbackProbe:
    """The probe's state machine (see the module doc). Feed :meth:`committed` every commit."""

    def __init__(self, config: FallbackConfig) -> None:
        self.config = config
        self.mode: Mode = "async"
        self.phase: Phase = "warmup"
        self._mark: tuple[int, float] | None = None  # (step, t) where the phase began
        self._left = config.warmup_steps  # steps still to skip (warmup, settle)
        self._rates: dict[Mode, float] = {}
        self._next_probe = math.inf
        self._probe_t0 = 0.0  # when the probe under way began
        self._hold_from_start = False  # an earlier run's choice: hold from the first commit
        #: the last choice this run measured (None: none yet, or only an earlier run's)
        self.last_choice: EarlierChoice | None = None
        #: the mismatch KL of the last ``window_steps`` stale steps (module doc)
        self._kl: deque[float] = deque(maxlen=config.window_steps)

    def reuse(self, earlier: EarlierChoice, step: int = 0) -> Switch:
        """Start in ``earlier``'s mode, held as a choice made at the first commit (module
        doc); the :class:`Switch` to apply and record before the first step (``step``: the
        last committed, 0 for a new run)."""
        if self._mark is not None:
            raise ValueError("an earlier run's choice is taken before the first commit")
        if not earlier.hold:  # an estimate: the usual warm-up, then the first probe
            self.mode, self._rates = earlier.mode, {}
            return self._switch(step, "chose", f"{earlier.why}; {earlier.mode} until the "
                                f"first probe, after {self.config.warmup_steps} steps",
                                start=True)
        self.mode, self.phase, self._hold_from_start = earlier.mode, "hold", True
        ra, rs = earlier.async_per_s, earlier.sync_per_s
        self._rates = {}
        if ra is not None:
            self._rates["async"] = ra
        if rs is not None:
            self._rates["sync"] = rs
        if earlier.why:
            return self._switch(step, "chose", f"{earlier.why}; {earlier.mode} until the next "
                                "probe", start=True)
        at = time.strftime("%H:%M:%S", time.localtime(earlier.measured_at))
        gain = ra / rs if ra is not None and rs else math.nan
        return self._switch(step, "chose", f"reused: an earlier run of the same work at a like "
                            f"load measured async {gain:.2f}x the sync window (at {at}); "
                            f"{earlier.mode} until the next probe", start=True)

    def committed(self, step: int, t: float, metrics: Mapping[str, float] | None = None
                  ) -> Switch | None:
        """Step ``step`` was committed at ``t`` with the trainer's ``metrics`` (its
        ``lag_mean`` and ``mismatch_kl`` feed the learning rule); a :class:`Switch` when the
        mode changes or a probe has chosen."""
        cfg = self.config
        self._feed_kl(metrics)
        if self._mark is not None and self.phase == "hold" and self.mode == "async" \
                and self._at_risk():
            return self._learning_fallback(step, t)
        if self._mark is None:
            self._mark = (step, t)
            if self._hold_from_start:
                self._next_probe = t + cfg.every_s
            return None
        if self.phase in ("warmup", "settle"):
            if self._left > 0:
                self._left -= 1
                return None
            if self.phase == "warmup":
                self._next_probe = t  # the first probe starts now
                self.phase = "hold"
            else:
                self.phase = "measure_other"
                self._mark = (step, t)
                return None
        if self.phase == "hold":
            if t < self._next_probe:
                return None
            self.phase, self._mark, self._probe_t0 = "measure", (step, t), t
            return None
        rate = self._rate(step, t)
        if rate is None:
            return None
        self._rates[self.mode] = rate
        if self.phase == "measure":  # the current mode measured: now the other one
            self.mode = _other(self.mode)
            self.phase = "settle"
            self._left = cfg.max_staleness + 1 if self.mode == "sync" else 1
            return self._switch(step, "probe", f"probe: {_other(self.mode)} measured at "
                                f"{rate:.1f} rollouts/s; measuring {self.mode}")
        return self._choose(step, t)

    def _rate(self, step: int, t: float) -> float | None:
        """Accepted rollouts/s since the mark, once the window is long enough."""
        assert self._mark is not None
        s0, t0 = self._mark
        n, dt = step - s0, t - t0
        if n < self.config.window_steps or dt < self.config.window_s or dt <= 0:
            return None
        return n * self.config.rollouts_per_step / dt

    def _choose(self, step: int, t: float) -> Switch:
        cfg, r = self.config, self._rates
        ra, rs = r["async"], r["sync"]
        pays = ra > (1 + cfg.margin) * rs
        risky = self._at_risk()
        self.mode = "async" if pays and not risky else "sync"
        self.phase, self._mark = "hold", (step, t)
        self._next_probe = t + max(cfg.every_s, cfg.hold_factor * (t - self._probe_t0))
        # the next run of the same work starts from the speed answer: a fallback for
        # learning is this run's late state (its stale steps' KL), not the work's
        self.last_choice = EarlierChoice("async" if pays else "sync", ra, rs, time.time())
        if self.mode == "async":
            why = f"async {ra / rs:.2f}x the sync window: asynchrony pays"
        elif pays:
            why = f"learning: async {ra / rs:.2f}x the sync window pays, but {self._risk()}"
        else:
            why = (f"async {ra / rs:.2f}x the sync window (needs > {1 + cfg.margin:.2f}x): "
                   "asynchrony does not pay here, falling back to sync")
        return self._switch(step, "chose", why)

    def _feed_kl(self, metrics: Mapping[str, float] | None) -> None:
        """A stale async step's mismatch KL into the window (module doc)."""
        if metrics is None or self.config.kl_risk is None or self.mode != "async":
            return
        lag, kl = metrics.get("lag_mean"), metrics.get("mismatch_kl")
        if isinstance(lag, int | float) and lag > 0 and isinstance(kl, int | float) \
                and math.isfinite(kl):
            self._kl.append(float(kl))

    def _kl_mean(self) -> float:
        return sum(self._kl) / len(self._kl) if self._kl else math.nan

    def _at_risk(self) -> bool:
        risk = self.config.kl_risk
        return (risk is not None and len(self._kl) == self._kl.maxlen
                and self._kl_mean() > risk)

    def _risk(self) -> str:
        return (f"the last {len(self._kl)} stale steps' mismatch KL {self._kl_mean():.4f} is "
                f"above {self.config.kl_risk} (control.fallback_kl_risk): asynchrony is "
                "costing learning, falling back to sync")

    def _learning_fallback(self, step: int, t: float) -> Switch:
        """Async at risk while held: sync at once, until the next probe ``every_s`` later."""
        why = f"learning: {self._risk()}"
        self.mode, self._mark = "sync", (step, t)
        self._next_probe = t + self.config.every_s
        self._kl.clear()  # the next async window is judged on its own steps
        # last_choice stays the last probe's speed answer (_choose): the next run of the same
        # work starts from it, its own KL guard acting again where its stale steps need it
        return self._switch(step, "chose", why)

    def _switch(self, step: int, phase: Literal["probe", "chose"], reason: str,
                start: bool = False) -> Switch:
        return Switch(step, self.mode, self.config.lookahead(self.mode), phase, reason,
                      self._rates.get("async"), self._rates.get("sync"), start)




def probe_for(cfg: Config) -> FallbackProbe | None:
    """The probe ``control.fallback`` asks for, or None (a sync run; ``false``; ``auto`` with
    the simulated engine, whose virtual-time stages never contend)."""
    ctl, run = cfg.control, cfg.run
    if run.max_staleness < 1 or ctl.fallback is False:
        return None
    if ctl.fallback == "auto" and engine_spec(cfg.rollout.engine).simulated:
        return None
    return FallbackProbe(FallbackConfig(
        max_staleness=run.max_staleness,
        rollouts_per_step=cfg.rollout.batch_groups * cfg.rollout.group_size,
        window_steps=ctl.fallback_window_steps, window_s=ctl.fallback_window_s,
        every_s=ctl.fallback_every_s, margin=ctl.fallback_margin,
        kl_risk=ctl.fallback_kl_risk,
    ))


__all__ = ["EarlierChoice", "FallbackConfig", "FallbackProbe", "Mode", "Switch", "probe_for"]
