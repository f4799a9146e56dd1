"""The controller when the window is the limit (control/levers.py): the tail levers and the
re-balancing of a conflict, as pure functions and in closed loop against a window-bound fake
plant whose trainer changes speed (virtual time: every snapshot carries its ``now``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from freshroll.control.controller import (
    ControlConfig,
    ControllerState,
    Decision,
    Settings,
    Snapshot,
    decide,
)
from freshroll.control.levers import (
    Levers,
    cancelled_share,
    conflict_target,
    conflict_workers,
    tail_levers,
    window_workers,
)
from freshroll.errors import ConfigError

W = 10.0


def lever(side: str, x: int = 0, deadline: bool = False, chi: float = 0.0,
          cooled: bool = True, max_extra: int = 4) -> tuple[Levers, str]:
    config = ControlConfig(group_size=4, max_extra=max_extra, chi_high=0.25)
    return tail_levers(side, Levers(x, deadline), chi, config,  # type: ignore[arg-type]
                       since=60.0 if cooled else 1.0)


# == pure rules =============================================================================
def test_a_conflict_raises_the_extras_by_one_up_to_the_bound_and_turns_deadlines_on():
    assert lever("conflict")[0] == Levers(1, True)
    assert lever("conflict", 3, True)[0] == Levers(4, True)
    new, why = lever("conflict", 4, True)
    assert new == Levers(4, True) and "max_extra 4" in why


def test_the_levers_wait_for_their_cooldown_and_are_off_without_a_bound():
    assert lever("conflict", 1, True, cooled=False)[0] == Levers(1, True)
    assert lever("conflict", max_extra=0) == (Levers(0, False), "")


def test_extras_come_down_when_too_much_is_cancelled_and_deadlines_stay_on():
    new, why = lever("trainer", 3, True, chi=0.4)
    assert new == Levers(2, True) and "40% of the window's requests cancelled" in why
    assert lever("producer", 3, True, chi=0.4)[0] == Levers(2, True)
    assert lever("balanced", 3, True, chi=0.1)[0] == Levers(3, True)  # worth its cost: kept
    assert lever("trainer", 0, True, chi=0.4)[0] == Levers(0, True)


def test_cancelled_share():
    assert cancelled_share({}, 100) == 0.0
    assert cancelled_share({"cancelled": 25, "stale": 9}, 75) == pytest.approx(0.25)


@pytest.mark.parametrize(("workers", "need", "since", "after"), [
    (16, 9, 60.0, 12),  # spare 16 - 9 - 0.25 = 6.75: -min(6, ceil(3.375))
    (16, 9, 10.0, 16),  # within the down cooldown (30 s)
    (9, 9, 60.0, 9),    # the window fills every slot: kept
    (3, 1, 60.0, 2),    # spare 1.75 -> -1
    (2, 1, 60.0, 2),    # spare 0.75 < 1: kept (the dead band)
])
def test_a_conflict_steers_the_workers_to_the_slots_the_window_fills(
        workers: int, need: int, since: float, after: int) -> None:
    n, why = conflict_workers(workers, need, ControlConfig(group_size=16, max_workers=32),
                              since_down=since, since_up=since)
    assert n == after and "window-bound" in why


def test_a_conflict_scales_up_at_once_to_a_higher_target_after_the_up_cooldown() -> None:
    config = ControlConfig(group_size=16, max_workers=32)
    assert conflict_workers(13, 26, config, since_down=1.0, since_up=60.0)[0] == 26
    assert conflict_workers(13, 26, config, since_down=1.0, since_up=1.0)[0] == 13


def test_the_conflict_target_scales_with_demand_above_the_lowest_seen() -> None:
    assert conflict_target(13, 0.0, None, 32) == (13, None)  # no demand measured yet
    assert conflict_target(13, 24.0, None, 32) == (13, 24.0)  # the first is the reference
    assert conflict_target(13, 34.0, 24.0, 32) == (13, 24.0)  # within the band (50%)
    assert conflict_target(13, 48.0, 24.0, 32) == (26, 24.0)  # twice as fast: twice the pool
    assert conflict_target(13, 96.0, 24.0, 32) == (32, 24.0)  # capped at max_workers
    assert conflict_target(13, 20.0, 24.0, 32) == (13, 20.0)  # a lower demand: the new ref


def test_the_window_workers():
    assert window_workers(2, 32, 16, 128, 0.05) == math.ceil(3 * 32 * 16 * 1.05 / 128)  # 13
    assert window_workers(2, 32, 20, 128, 0.05) == 16  # four extras per group
    assert window_workers(0, 1, 2, 128, 0.0) == 1
    # a wider admission window (run.admission_window W = 9 steps at η 2): its requests
    assert window_workers(2, 32, 16, 128, 0.05, 9) == math.ceil(9 * 32 * 16 * 1.05 / 128)  # 38
    assert window_workers(2, 32, 16, 128, 0.05, None) == window_workers(2, 32, 16, 128, 0.05)


def test_config_bounds() -> None:
    with pytest.raises(ConfigError, match="max_extra"):
        ControlConfig(group_size=4, max_extra=-1)
    with pytest.raises(ConfigError, match="chi_high"):
        ControlConfig(group_size=4, chi_high=-0.1)
    c = ControlConfig(group_size=4, max_workers=8, max_extra=2)
    assert c.clamp(Settings(0, 4, 4, extra=9, deadline=True)).extra == 2
    assert ControlConfig(group_size=4).clamp(Settings(0, 4, 4, 3, True)) == Settings(
        ControlConfig(group_size=4).limit_for(1, 4), 4, 1, 0, False)  # no bound: levers off


# == closed loop: a plant whose trainer changes speed, and whose window can bind ==============
@dataclass
class WindowPlant:
    """Production ``n × p`` (p per worker), but at most ``window`` samples/s get through the
    admission window (stragglers hold it); the trainer eats ``trainer`` samples/s when fed.
    Each extra request per group widens the window by ``gain`` (stop at target frees it
    sooner) and cancels ``waste`` of a group's requests per extra."""

    trainer: float
    window: float
    p: float = 10.0
    gain: float = 0.15
    waste: float = 0.05
    completed: int = 0

    def snap(self, now: float, cur: Settings) -> Snapshot:
        n = cur.workers
        window = self.window * (1 + self.gain * cur.extra)
        delivered = min(n * self.p, window, self.trainer)
        wait = W * (1 - delivered / self.trainer)
        blocked = n * W * (1 - delivered / (n * self.p))
        self.completed += int(delivered * W)
        cancelled = int(delivered * W * self.waste * cur.extra)
        return Snapshot(now=now, window_s=W, settings=cur, consumed_samples=int(delivered * W),
                        trainer_wait_s=wait, waited_samples=int((self.trainer - delivered) * W),
                        blocked_s=blocked, worker_rates=(self.p,) * n,
                        completed=self.completed, in_flight=n * cur.concurrency,
                        max_staleness=2, batch_groups=8, fed_rate=self.trainer,
                        discards={"cancelled": cancelled} if cancelled else {},
                        generated=int(delivered * W))


def run_plant(plant: WindowPlant, config: ControlConfig, phases: list[tuple[float, float, float]],
              windows: int) -> list[Decision]:
    """``phases``: (from t, trainer, window) in order; one decision per window of W s."""
    cur, st, log = Settings(0, 128, 16), ControllerState(), []
    for i in range(windows):
        now = (i + 1) * W
        _, plant.trainer, plant.window = [ph for ph in phases if ph[0] <= now][-1]
        d = decide(plant.snap(now, cur), st, config)
        log.append(d)
        cur, st = d.settings, d.state
    return log


CONFIG = ControlConfig(group_size=16, max_workers=32, max_extra=4, up_cooldown_s=5.0,
                       down_cooldown_s=30.0, horizon_s=120.0)


def test_after_each_trainer_speed_change_the_pool_re_balances_within_five_steps():
    """The elastic bench's shape (the trainer 2x faster at t = 300 s, back at 600 s), a trainer
    step being a window here: the worker count moves within 5 windows of each change, toward
    D(1+h)/p; the window never binds (window 1000/s)."""
    log = run_plant(WindowPlant(80.0, 1000.0), CONFIG,
                    [(0, 80.0, 1000.0), (300, 160.0, 1000.0), (600, 80.0, 1000.0)], 90)
    workers = [d.settings.workers for d in log]
    assert workers[28] == math.ceil(80 * 1.05 / 10)  # settled before the change
    faster, slower = 29, 59  # the first windows at the new speed (now = 300 s, 600 s)
    up = next(i for i in range(faster, 90) if workers[i] != workers[faster - 1])
    assert up - faster < 5 and workers[up] > workers[faster - 1]
    assert workers[slower - 1] == math.ceil(160 * 1.05 / 10)
    down = next(i for i in range(slower, 90) if workers[i] != workers[slower - 1])
    assert down - slower < 5 and workers[down] < workers[slower - 1]
    assert workers[-1] == math.ceil(80 * 1.05 / 10)


def test_when_the_window_binds_the_levers_move_and_workers_come_down_to_its_slots():
    """Window 50/s < trainer 80/s with 16 workers x 10/s: a conflict. The extras rise to the
    bound one per cooldown, deadlines go on, and the pool comes down to the workers whose
    slots hold the window, (2 + 1) x 8 x (16 + x) x 1.05 / 128, never below."""
    log = run_plant(WindowPlant(80.0, 50.0), CONFIG, [(0, 80.0, 50.0)], 60)
    assert log[0].bottleneck == "conflict"
    assert [d.settings.extra for d in log[:8:2]] == [1, 2, 3, 4]
    assert all(d.settings.deadline for d in log)
    c = log[-1].settings.concurrency
    n_w = math.ceil(3 * 8 * (16 + 4) * 1.05 / c)
    assert log[-1].settings.workers <= n_w + 1 and log[-1].settings.workers >= n_w
    downs = [d for d in log if d.settings.workers < d.previous.workers]
    assert downs and all("window" in d.reason for d in downs)


def test_the_levers_travel_in_the_record_and_resume():
    config = ControlConfig(group_size=16, max_workers=32, max_extra=4)
    plant = WindowPlant(trainer=80.0, window=60.0)
    d = decide(plant.snap(W, Settings(0, 8, 8)), ControllerState(), config)
    assert d.settings.extra == 1 and d.state.last_lever_at == W
    rec = d.record()
    assert rec["settings"]["extra"] == 1 and rec["settings"]["deadline"] is True
    assert ControllerState.from_record(rec["state"]) == d.state
    again = decide(replace(plant.snap(2 * W, d.settings)), d.state, config)
    assert again.settings.extra == 1  # within the lever cooldown (20 s)
