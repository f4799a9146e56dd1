"""The controller's rules as pure functions, in closed loop against a tiny fake plant on
virtual time (no clock is read: every snapshot carries its ``now``)."""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freshroll.clock import VirtualClock
from freshroll.control.controller import (
    ControlConfig,
    ControllerState,
    Decision,
    Settings,
    Snapshot,
    StaticController,
    admission_budget,
    bottleneck,
    decide,
)
from freshroll.errors import ConfigError
from freshroll.harness.verify import verify_ledger
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.freshness import admission_capacity
from freshroll.kernel.results import KernelConfig
from freshroll.ledger.lineage import PolicyVersion, RewardVersion
from freshroll.ledger.store import Ledger

W = 10.0  # seconds per measuring window (one decision per window)


def cfg(**kw: float) -> ControlConfig:
    base: dict[str, float] = {"group_size": 4, "min_workers": 1, "max_workers": 64,
                              "max_concurrency": 64}
    base.update(kw)
    return ControlConfig(**base)  # type: ignore[arg-type]


def s(workers: int, concurrency: int = 4, limit: int = 0) -> Settings:
    return Settings(admission_limit=limit, concurrency=concurrency, workers=workers)


# == the fake plant =====================================================================
@dataclass
class Plant:
    """Production = workers × per-worker rate; consumption = min(production, trainer rate).

    ``t0``/``t1``: per-worker rate ``c / (t0 + t1 × c) × scale`` (continuous batching); with
    ``t1 = 0`` the rate is ``scale`` whatever the concurrency.
    """

    trainer: float                # samples/s the trainer eats when fed
    scale: float = 10.0
    t0: float = 1.0
    t1: float = 0.0
    noise: float = 0.0
    seed: int = 0
    completed: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def rate(self, c: int) -> float:
        base = self.scale if self.t1 == 0 else self.scale * c / (self.t0 + self.t1 * c)
        return base * (1 + self.rng.uniform(-self.noise, self.noise))

    def window(self, now: float, cur: Settings, **extra: object) -> Snapshot:
        n = cur.workers
        rates = tuple(self.rate(cur.concurrency) for _ in range(n))
        prod = sum(rates)
        trainer = self.trainer * (1 + self.rng.uniform(-self.noise, self.noise))
        if prod < trainer:
            consumed, wait, blocked = prod * W, W * (1 - prod / trainer), 0.0
            waited = (trainer - prod) * W
        else:
            consumed, wait, blocked, waited = trainer * W, 0.0, n * W * (1 - trainer / prod), 0
        self.completed += int(min(prod, trainer) * W)
        fields: dict[str, object] = {
            "now": now, "window_s": W, "settings": cur, "consumed_samples": int(consumed),
            "trainer_wait_s": wait, "waited_samples": int(waited), "blocked_s": blocked,
            "worker_rates": rates, "completed": self.completed,
            "in_flight": n * cur.concurrency, "max_staleness": 2, "batch_groups": 8,
        }
        fields.update(extra)
        return Snapshot(**fields)  # type: ignore[arg-type]


def run_loop(
    plant: Plant, config: ControlConfig, start: Settings, steps: int, t0: float = 0.0,
    state: ControllerState | None = None,
) -> tuple[list[Decision], ControllerState]:
    cur, st_, out = start, state or ControllerState(), []
    for i in range(steps):
        d = decide(plant.window(t0 + (i + 1) * W, cur), st_, config)
        out.append(d)
        cur, st_ = d.settings, d.state
    return out, st_


def settled_after(decisions: list[Decision]) -> int:
    """Index of the first decision after which the worker count never changes again."""
    last = len(decisions) - 1
    while last > 0 and decisions[last - 1].settings.workers == decisions[-1].settings.workers:
        last -= 1
    return last


# == closed loop ==========================================================================
def test_settles_under_constant_load_and_stays_settled():
    plant = Plant(trainer=100.0, noise=0.02, seed=1)
    ds, _ = run_loop(plant, cfg(), s(1), 200)
    n = ds[-1].settings.workers
    assert n == math.ceil(100 * 1.05 / 10)  # the target of the rule
    assert settled_after(ds) <= 3
    changes = sum(1 for a, b in itertools.pairwise(ds) if a.settings.workers != b.settings.workers)
    assert changes <= 2, [d.settings.workers for d in ds[:10]]
    # the trainer is fed at the settled point
    omega = [bottleneck(d.inputs, cfg())[1] for d in ds[-50:]]
    assert max(omega) < cfg().idle_high


def test_rebalances_when_the_trainer_doubles_then_halves():
    config = cfg()
    plant = Plant(trainer=100.0, noise=0.01, seed=2)
    ds, st_ = run_loop(plant, config, s(1), 30)
    before = ds[-1].settings.workers
    plant.trainer = 200.0
    up, st_ = run_loop(plant, config, ds[-1].settings, 30, t0=30 * W, state=st_)
    assert up[-1].settings.workers == math.ceil(200 * 1.05 / 10) > before
    assert settled_after(up) <= 1  # scale-up: one decision (up cooldown < window)
    plant.trainer = 100.0
    down, _ = run_loop(plant, config, up[-1].settings, 60, t0=60 * W, state=st_)
    assert down[-1].settings.workers == before
    # scale-down is slower (cooldown 30 s = 3 windows, a share of the surplus each time), bounded
    assert 3 <= settled_after(down) <= 8
    assert down[0].settings.workers > before + 1  # not the whole surplus at once
    assert all(b.settings.workers <= a.settings.workers for a, b in itertools.pairwise(down))


def _trace(controller_config: ControlConfig, n0: int, static: bool) -> tuple[float, float]:
    """(worker-seconds, trainer idle ratio) over a trace whose trainer doubles, then halves."""
    plant, cur, st_ = Plant(trainer=100.0, noise=0.01, seed=4), s(n0), ControllerState()
    worker_s = wait_s = 0.0
    for i, trainer in enumerate([100.0] * 30 + [200.0] * 30 + [100.0] * 30):
        plant.trainer = trainer
        snap = plant.window((i + 1) * W, cur)
        worker_s, wait_s = worker_s + cur.workers * W, wait_s + snap.trainer_wait_s
        if not static:
            d = decide(snap, st_, controller_config)
            cur, st_ = d.settings, d.state
    return worker_s, wait_s / (90 * W)


def test_elastic_trace_uses_fewer_worker_seconds_than_the_best_static_setting():
    config = cfg()
    worker_s, idle = _trace(config, 11, static=False)
    static = [(ws, n) for n in range(1, 65) for ws, i in [_trace(config, n, static=True)]
              if i <= idle]
    best_ws, best_n = min(static)
    assert best_n >= 20  # a static setting must provision for the fast phase
    assert worker_s <= 0.85 * best_ws, (worker_s, best_ws)


def test_scales_up_when_the_trainer_starves():
    d = decide(Plant(trainer=100.0).window(W, s(2)), ControllerState(), cfg())
    assert d.bottleneck == "producer"
    assert d.settings.workers == 11 and "waited on" in d.reason
    assert d.state.last_up_at == W


def test_never_past_the_worker_bounds():
    config = cfg(min_workers=3, max_workers=6)
    up = decide(Plant(trainer=1000.0).window(W, s(5)), ControllerState(), config)
    assert up.settings.workers == 6
    held = decide(Plant(trainer=1000.0).window(100.0, s(6)), up.state, config)
    assert held.settings.workers == 6 and "at max_workers" in held.reason
    down = decide(Plant(trainer=1.0).window(W, s(4)), ControllerState(), config)
    assert down.settings.workers == 3
    floor = decide(Plant(trainer=1.0).window(100.0, s(3)), ControllerState(), config)
    assert floor.settings.workers == 3 and "at min_workers" in floor.reason
    outside = decide(Plant(trainer=60.0).window(W, s(99, 999)), ControllerState(), config)
    assert outside.settings.workers <= 6 and outside.settings.concurrency <= 64


def test_no_scale_up_when_the_trainer_waited_on_no_samples():
    snap = replace(Plant(trainer=100.0).window(W, s(2)), waited_samples=0)  # e.g. weight sync
    d = decide(snap, ControllerState(), cfg())
    assert d.settings.workers == 2 and "no samples" in d.reason


def test_scales_down_when_backpressure_grows():
    d = decide(Plant(trainer=50.0).window(100.0, s(20)), ControllerState(), cfg())
    assert d.bottleneck == "trainer"
    assert d.settings.workers < 20
    assert d.settings.workers >= math.ceil(50 * 1.05 / 10)  # never below the demand


def test_scales_down_when_lag_grows_without_backpressure():
    config = cfg()
    plant = Plant(trainer=100.0)
    snap = plant.window(100.0, s(14), lag_mean=1.8)  # β = 1 - 100/140 > 10% anyway
    snap = replace(snap, blocked_s=0.0)  # no backpressure measured: the lag alone decides
    d = decide(snap, ControllerState(), config)
    assert d.bottleneck == "trainer" and d.settings.workers < 14
    calm = decide(replace(snap, lag_mean=0.5), ControllerState(), config)
    assert calm.bottleneck == "balanced" and calm.settings.workers == 14


def test_both_high_is_reported_as_a_conflict_and_changes_no_worker():
    snap = replace(Plant(trainer=200.0).window(W, s(4)), blocked_s=4 * W * 0.5)
    d = decide(snap, ControllerState(), cfg())
    assert d.bottleneck == "conflict"
    assert d.settings.workers == 4
    assert "measurement fault" in d.reason and "serializes" in d.reason


def test_after_a_conflict_a_trainer_bound_window_neither_scales_down_nor_cuts():
    # a window-bound pipeline (P1 at eta 2: decisions every 5 s, trainer steps of 8 s)
    # alternates between conflict windows (the trainer waits on the window's stragglers
    # while workers are blocked) and trainer-bound ones (the trainer's busy phase); the
    # second are not surplus production, and their stale discards are stragglers: before
    # this guard they removed workers and halved concurrency (P1 seed 0: workers 12 -> 8 ->
    # 16 -> 11 -> 16, concurrency 128 -> 64 -> 32 -> 17; 47.9 accepted/s against 51.7)
    config = cfg(max_workers=16)
    conflict = replace(Plant(trainer=200.0).window(W, s(12, 8)), blocked_s=12 * W * 0.5)
    first = decide(conflict, ControllerState(), config)
    assert first.bottleneck == "conflict" and first.state.last_conflict_at == W
    busy = replace(Plant(trainer=50.0).window(2 * W, s(12, 8)), completed=10_000,
                   in_flight=96, discards={"stale": 16})
    d = decide(busy, first.state, config)
    assert d.bottleneck == "trainer"
    assert d.settings.workers == 12 and d.settings.concurrency == 8
    assert "window-bound within the down cooldown" in d.reason
    assert "stragglers (window-bound)" in d.reason
    # past the down cooldown with no conflict since, the trainer-bound rules act again
    later = replace(busy, now=W + config.down_cooldown_s + 1, completed=20_000)
    again = decide(later, d.state, config)
    assert again.settings.workers < 12 and "hard cut" in again.reason
    # the state travels through the decision record (a resume keeps the guard)
    back = ControllerState.from_record(json.loads(json.dumps(first.record()))["state"])
    assert back.last_conflict_at == W


# == hysteresis, cooldown, switch cost =====================================================
def test_up_cooldown_and_down_cooldown_are_asymmetric():
    config = cfg(up_cooldown_s=5.0, down_cooldown_s=30.0)
    starving = Plant(trainer=100.0)
    last_up = ControllerState(last_up_at=100.0)
    assert decide(starving.window(103.0, s(2)), last_up, config).settings.workers == 2
    assert decide(starving.window(106.0, s(2)), last_up, config).settings.workers == 11
    # a scale-down waits the long cooldown, after an up as after a down
    fed = Plant(trainer=20.0)
    for state in (last_up, ControllerState(last_down_at=100.0)):
        held = decide(fed.window(120.0, s(10)), state, config)
        assert held.settings.workers == 10 and "cooling down" in held.reason
        assert decide(fed.window(131.0, s(10)), state, config).settings.workers < 10
    # but a starving trainer may scale up right after a scale-down
    assert decide(starving.window(106.0, s(2)), ControllerState(last_down_at=105.0),
                  config).settings.workers == 11


def test_a_switch_must_pay_for_its_measured_cost():
    config = cfg(horizon_s=120.0)
    plant = Plant(trainer=100.0)
    dear = plant.window(1000.0, s(2), switch_cost_s=200.0)
    d = decide(dear, ControllerState(), config)
    assert d.settings.workers == 2 and "not worth it" in d.reason
    cheap = replace(dear, switch_cost_s=10.0)
    assert decide(cheap, ControllerState(), config).settings.workers == 11
    # the horizon is the time since the last switch: 8 s ago at 10 s a switch is not worth it
    recent = ControllerState(last_down_at=992.0)
    assert decide(cheap, recent, config).settings.workers == 2
    assert decide(cheap, ControllerState(last_down_at=900.0), config).settings.workers == 11


def test_dead_band_keeps_a_surplus_below_one_worker():
    # production 11 × 10 = 110 vs demand 100 × 1.05: the surplus is half a worker
    d = decide(replace(Plant(trainer=100.0).window(500.0, s(11)), blocked_s=11 * W * 0.2),
               ControllerState(), cfg())
    assert d.bottleneck == "trainer" and d.settings.workers == 11
    assert "below one worker" in d.reason


def test_scale_down_never_removes_more_than_the_whole_spare_workers():
    # 12 × 10 - 105 = 15 samples/s: 1.25 spare workers; even down_gain 1 removes one, not two
    snap = replace(Plant(trainer=100.0).window(500.0, s(12)), blocked_s=12 * W * 0.2)
    d = decide(snap, ControllerState(), cfg(down_gain=1.0))
    assert d.settings.workers == 11
    assert 11 * 10 >= 100 * 1.05


def test_clock_going_back_restarts_cooldowns_instead_of_blocking_them():
    config = cfg()
    state = ControllerState(last_down_at=10_000.0)  # from a clock that ran far ahead
    fed = Plant(trainer=20.0)
    first = decide(fed.window(50.0, s(10)), state, config)
    assert first.state.last_down_at == 50.0 and first.settings.workers == 10
    assert decide(fed.window(81.0, s(10)), first.state, config).settings.workers < 10


# == concurrency: AIMD per pool turnover, hard cut latched ==================================
def test_aimd_finds_the_knee_and_stays_there():
    # per-worker rate c / (1 + 0.1 c): a probe from c to c + 1 gains less than a quarter of
    # the proportional gain past t1 (c + 1) > 3 t0, i.e. c + 1 > 30
    config = cfg(max_workers=2, min_workers=2)
    plant = Plant(trainer=1e9, scale=1.0, t0=1.0, t1=0.1)
    ds, st_ = run_loop(plant, config, s(2, 1), 200)
    cs = [d.settings.concurrency for d in ds]
    assert max(cs) <= 31
    assert cs[-1] == 30 and st_.ceiling == 30
    assert len(set(cs[-100:])) == 1


def test_both_levers_settle_and_consolidate_onto_fewer_workers():
    # start far below the knee: the trainer starves, workers jump up; then concurrency keeps
    # probing while workers can be removed, so the run ends on fewer, fuller workers
    config = cfg(max_workers=64)
    plant = Plant(trainer=300.0, scale=1.0, t0=1.0, t1=0.1, noise=0.01, seed=3)
    ds, _ = run_loop(plant, config, s(1, 1), 300)
    assert ds[0].settings.workers == 64  # the starving trainer is served first
    last = [(d.settings.workers, d.settings.concurrency) for d in ds[-150:]]
    assert len(set(last)) == 1, last[:5]
    n, c = last[-1]
    assert n <= 0.8 * 64 and c > 10
    assert n * c / (1 + 0.1 * c) >= 300  # still feeds the trainer
    assert max(bottleneck(d.inputs, config)[1] for d in ds[-150:]) < config.idle_high


def test_a_probe_is_judged_a_failure_only_when_the_measurement_can_tell():
    config = cfg(min_workers=4, max_workers=4)
    probe = ControllerState(probe=(10, 10.0))  # c 10 -> 11 expects +10 %, needs > +2.5 %
    base = Snapshot(now=W, window_s=W, settings=s(4, 11), completed=10**6, in_flight=44,
                    trainer_wait_s=5.0, waited_samples=100, consumed_samples=100)
    flat = decide(replace(base, worker_rates=(10.1,) * 4), probe, config)  # +1 %, exact
    assert flat.settings.concurrency == 10 and flat.state.ceiling == 10
    noisy = (8.1, 9.1, 11.1, 12.1)  # median +1 %, but its standard error is ~ 10 %
    kept = decide(replace(base, worker_rates=noisy), probe, config)
    assert kept.settings.concurrency >= 11 and kept.state.ceiling is None


def test_concurrency_waits_for_a_pool_turnover():
    config = cfg()
    snap = Plant(trainer=1e9).window(W, s(2, 4))  # producer-bound, slots full
    d = decide(replace(snap, completed=7), ControllerState(), config)  # pool = 8
    assert d.settings.concurrency == 4 and "not turned over" in d.reason
    assert decide(replace(snap, completed=8), ControllerState(), config).settings.concurrency == 5


def test_stale_discards_while_the_trainer_starves_cut_nothing():
    """Producer-bound (or a conflict), stale samples are stragglers, not over-production:
    cutting concurrency would only starve the trainer more (P3 collapsed to 0.4x static)."""
    config = cfg(min_workers=2, max_workers=2)
    snap = replace(Plant(trainer=1e9).window(W, s(2, 8)), completed=100, in_flight=16,
                   discards={"stale": 3})
    d = decide(snap, ControllerState(), config)
    assert d.bottleneck == "producer"
    assert d.settings.concurrency >= 8 and not d.state.latched and "hard cut" not in d.reason


def test_hard_cut_latches_until_drained():
    config = cfg(min_workers=2, max_workers=2)
    snap = replace(Plant(trainer=5.0).window(W, s(2, 8)), completed=100, in_flight=16,
                   discards={"stale": 3})  # trainer-bound: production runs ahead
    cut = decide(snap, ControllerState(), config)
    assert cut.settings.concurrency == 4 and cut.state.latched and "hard cut" in cut.reason
    # still more in flight than the new pool (2 × 4): no change, not even another cut
    st_ = cut.state
    for i, in_flight in enumerate((14, 10, 9)):
        d = decide(replace(snap, now=W * (i + 2), settings=cut.settings, in_flight=in_flight,
                           completed=1000 * (i + 2)), st_, config)
        assert d.settings.concurrency == 4 and d.state.latched and "latched" in d.reason
        st_ = d.state
    drained = decide(replace(snap, now=60.0, settings=cut.settings, in_flight=8,
                             completed=9000, discards={}), st_, config)
    assert not drained.state.latched and drained.settings.concurrency == 4
    assert drained.state.ceiling == 7  # never back to the level that was cut
    # after the drain, once the trainer starves, it probes upwards again, up to that ceiling
    starving = replace(Plant(trainer=1e9).window(70.0, drained.settings), in_flight=8,
                       completed=9100)
    nxt = decide(starving, drained.state, config)
    assert nxt.settings.concurrency == 5
    assert nxt.state.ceiling == 7


def test_concurrency_is_kept_at_min_workers_with_production_ahead():
    # trainer-bound at min_workers: no worker to remove, and the admission limit sheds the
    # surplus; lowering c would only make each call dearer per row (a soft trim 128 -> 112
    # cost the real embedded default 11%, docs/control.md)
    config = cfg(min_workers=10)
    plant = Plant(trainer=60.0, scale=10.0, t0=16.0, t1=1e-12)  # rate ∝ c: 10/s at c = 16
    cur, state = s(10, 16), ControllerState()
    for i in range(30):
        d = decide(plant.window(W * (i + 1), cur), state, config)
        assert d.settings.workers == 10 and d.settings.concurrency == 16, d.reason
        cur, state = d.settings, d.state
    assert bottleneck(plant.window(400.0, cur), config)[0] == "trainer"  # production ahead
    # above min_workers the surplus goes by removing workers, concurrency is not cut
    d = decide(plant.window(W, s(10, 16)), ControllerState(), cfg(min_workers=1))
    assert d.settings.workers < 10 and d.settings.concurrency >= 16


# == admission and resume ====================================================================
def test_admission_limit_follows_workers_and_concurrency():
    config = cfg(group_size=4, admission_slack=0.5)
    d = decide(Plant(trainer=100.0).window(W, s(2, 4)), ControllerState(), config)
    n, c = d.settings.workers, d.settings.concurrency
    assert d.settings.admission_limit == math.ceil(n * c * 1.5 / 4)


def test_admission_budget_is_the_freshness_budget_under_the_cap():
    snap = Snapshot(now=0.0, window_s=W, settings=s(1), version=3, max_staleness=1,
                    batch_groups=4, groups_accepted=14, groups_running=1)
    # (1 + 3 + 1) × 4 - (14 + 1) = 5, under a cap of 100 - 1
    assert admission_budget(snap, s(1, limit=100)) == 5
    assert admission_budget(snap, s(1, limit=3)) == 2  # 3 - 1 running
    assert admission_budget(snap, s(1, limit=1)) == 0


V0 = PolicyVersion.initial("control-model")
REWARD = str(RewardVersion.of("unit", config={"k": 1}))


def _open(path: Path, clock: VirtualClock) -> SampleBuffer:
    return SampleBuffer.open(Ledger(path, sync="off"),
                             KernelConfig(max_staleness=1, batch_groups=2, group_size=2),
                             clock, run_id="control", initial_version=V0)


def _snap(buf: SampleBuffer) -> Snapshot:
    stats = buf.stats()
    return Snapshot(
        now=0.0, window_s=W, settings=s(1), version=stats["version"],
        max_staleness=buf.config.max_staleness, batch_groups=buf.config.batch_groups,
        groups_accepted=stats["groups_accepted"], groups_running=stats["groups_running"],
    )


def test_budget_after_a_resume_comes_from_the_recovered_counts(tmp_path):
    """AReaL #1388: after a resume the budget must neither restart at (η + v + 1) × B
    (counts at zero, version recovered) nor count re-issued work twice."""
    clock, path, cap = VirtualClock(), tmp_path / "ledger.sqlite", s(1, limit=1000)
    buf = _open(path, clock)
    epoch = buf.register_worker("w0")
    for step in range(3):
        for _ in range(admission_budget(_snap(buf), cap)):
            buf.admit(f"p{buf.groups_admitted}")
        for rid in buf.take_requests(4):  # two groups' worth
            sid = buf.start(rid, "w0", epoch, buf.version)  # type: ignore[arg-type]
            buf.complete(sid, tokens=1, gen_s=0.0)
            buf.reward(sid, 0.5, REWARD)
        lease = buf.lease()
        assert lease is not None, step
        buf.commit(lease.id, "s")
    for _ in range(admission_budget(_snap(buf), cap)):
        buf.admit(f"p{buf.groups_admitted}")
    running = [buf.start(r, "w0", epoch, buf.version) for r in buf.take_requests(3)]  # type: ignore[arg-type]
    buf.complete(running[0], tokens=1, gen_s=0.0)
    buf.ledger.flush()
    before, in_flight, admitted = _snap(buf), buf.in_flight(), buf.groups_admitted
    assert before.version == 3 and admission_budget(before, cap) == 0  # the window is full
    buf.ledger._db.close()  # the process dies

    buf2 = _open(path, clock)
    after = _snap(buf2)
    assert (after.version, after.groups_accepted, after.groups_running) == (
        before.version, before.groups_accepted, before.groups_running)
    assert admission_budget(after, cap) == 0 == buf2.capacity()
    # the bug's shape: version recovered, counts restarted -> a burst of (η + v + 1) × B
    assert admission_capacity(max_staleness=1, version=3, batch_groups=2, accepted=0,
                              running=0) == 10
    # re-issued attempts are the same requests, not new admissions
    assert buf2.in_flight() == in_flight
    assert buf2.groups_admitted == admitted
    buf2.shutdown("done")
    assert verify_ledger(buf2.ledger).ok


def test_controller_state_survives_a_resume_through_its_record():
    config = cfg()
    straight, _ = run_loop(Plant(trainer=100.0, noise=0.02, seed=5), config, s(1), 40)
    plant = Plant(trainer=100.0, noise=0.02, seed=5)
    cur, st_, resumed = s(1), ControllerState(), []
    for i in range(40):
        d = decide(plant.window((i + 1) * W, cur), st_, config)
        rec = json.loads(json.dumps(d.record()))  # the ledger event body, through JSON
        cur, st_ = Settings(**rec["settings"]), ControllerState.from_record(rec["state"])
        resumed.append(d)
    assert [d.settings for d in resumed] == [d.settings for d in straight]
    assert [d.reason for d in resumed] == [d.reason for d in straight]


# == static and config =========================================================================
def test_static_controller_changes_nothing_but_reads_the_bottleneck():
    hand = s(3, 5, limit=7)
    d = StaticController(cfg()).decide(Plant(trainer=1000.0).window(W, hand), ControllerState())
    assert d.settings == hand and not d.changed
    assert d.bottleneck == "producer" and d.reason.startswith("static")


@pytest.mark.parametrize("bad", [
    {"min_workers": 0}, {"min_workers": 5, "max_workers": 4}, {"min_concurrency": 0},
    {"idle_low": 0.05, "idle_high": 0.03}, {"hard_factor": 1.0}, {"up_cooldown_s": 60.0},
    {"headroom": -0.1}, {"group_size": 0}, {"down_gain": 0.0},
])
def test_bad_config_is_a_config_error_naming_the_field(bad):
    with pytest.raises(ConfigError, match="control"):
        cfg(**bad)


# == property: outputs always within bounds ====================================================
finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
snapshots = st.builds(
    Snapshot,
    now=st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    window_s=st.floats(min_value=-1.0, max_value=1e4, allow_nan=False),
    settings=st.builds(Settings, admission_limit=st.integers(-5, 10_000),
                       concurrency=st.integers(-5, 500), workers=st.integers(-5, 500)),
    consumed_samples=st.integers(0, 10**7), trainer_wait_s=finite,
    waited_samples=st.integers(0, 10**7), blocked_s=finite,
    worker_rates=st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=8).map(tuple),
    switch_cost_s=finite, completed=st.integers(0, 10**9), in_flight=st.integers(0, 10**6),
    version=st.integers(0, 10**4), max_staleness=st.integers(0, 8),
    batch_groups=st.integers(1, 64), groups_accepted=st.integers(0, 10**6),
    groups_running=st.integers(0, 10**4), lag_mean=finite, lag_max=st.integers(0, 100),
    discards=st.dictionaries(st.sampled_from(["stale", "fenced", "invalid"]),
                             st.integers(0, 100), max_size=3),
)
states = st.builds(
    ControllerState,
    last_up_at=st.none() | st.floats(-1e6, 1e6), last_down_at=st.none() | st.floats(-1e6, 1e6),
    turnover_mark=st.integers(0, 10**9),
    probe=st.none() | st.tuples(st.integers(1, 100), st.floats(0.0, 1e3)),
    ceiling=st.none() | st.integers(1, 100), latched=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(snap=snapshots, state=states, lo=st.integers(1, 8), span=st.integers(0, 50),
       clo=st.integers(1, 8), cspan=st.integers(0, 64))
def test_outputs_always_within_bounds(snap, state, lo, span, clo, cspan):
    config = cfg(min_workers=lo, max_workers=lo + span, min_concurrency=clo,
                 max_concurrency=clo + cspan)
    d = decide(snap, state, config)
    assert config.min_workers <= d.settings.workers <= config.max_workers
    assert config.min_concurrency <= d.settings.concurrency <= config.max_concurrency
    assert d.settings.admission_limit == config.limit_for(d.settings.workers,
                                                          d.settings.concurrency) >= 1
    assert admission_budget(snap, d.settings) >= 0
    json.dumps(d.record(), allow_nan=False)  # always a valid event body
    assert isinstance(d.reason, str) and d.reason


def test_the_admission_limit_never_goes_below_one_trainer_batch():
    """One HF worker of 64 requests, groups of 16, batches of 8 groups: slots alone would
    admit ceil(64 x 1.5 / 16) = 6 groups, fewer than one batch, which serialized the
    embedded default's adaptive run (986 vs 1,129 accepted/s static)."""
    config = cfg(group_size=16, batch_groups=8, max_workers=1)
    assert config.limit_for(1, 64) == 8
    assert config.clamp(s(1, 64)).admission_limit == 8
    assert cfg(group_size=4, batch_groups=2).limit_for(8, 8) == 24  # slots above B: unchanged
    with pytest.raises(ConfigError, match="batch_groups"):
        cfg(batch_groups=0)


def test_the_control_section_takes_the_controllers_defaults():
    import dataclasses

    from freshroll.config.run import ControlSection

    defaults = {f.name: f.default for f in dataclasses.fields(ControlConfig)}
    sec = ControlSection()
    shared = ("idle_high", "idle_low", "blocked_high", "up_cooldown_s", "down_cooldown_s",
              "kv_high", "min_workers", "min_concurrency")
    assert {k: getattr(sec, k) for k in shared} == {k: defaults[k] for k in shared}
