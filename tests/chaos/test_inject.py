"""The Injector: every fault kind fires once, is recorded with its index, and leaves the
evidence of what it did in the ledger, while ``verify`` holds; the same seed gives the same
ledger; the shipped library loads. Each run is the simulated cluster in virtual time."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from inject_support import (
    LIBRARY,
    Case,
    Killed,
    event_key,
    evidence,
    on_kill,
    run_case,
    scenario,
)

from freshroll.chaos.inject import Injector
from freshroll.chaos.plan import ENV_KINDS, FAULT_KINDS, HANDOFFS, PROCESS_KINDS, load_plan
from freshroll.errors import ConfigError, Interrupted
from freshroll.ledger import events as ev

STEP = {"step": 3}


def _after(case: Case, kind: type[ev.Event], t: float, **match: Any) -> list[Any]:
    return [e for e in case.of(kind) if e.ts >= t
            and all(getattr(e, k) == v for k, v in match.items())]


def _fault(case: Case) -> ev.FaultInjected:
    (fault,) = case.faults()
    return fault


def stall_worker(case: Case) -> None:
    f = _fault(case)
    fences = _after(case, ev.WorkerFenced, f.ts, worker=f.target, reason="timeout")
    assert fences, "the zombie's epoch was never fenced by the generate timeout"
    late = [r for r in case.rejected("fenced") if r.ts > fences[0].ts]
    assert late, "the zombie's completions never arrived after the fence"


def kill_worker(case: Case) -> None:
    f = _fault(case)
    (fence,) = _after(case, ev.WorkerFenced, f.ts, worker=f.target, reason="lost")
    assert _after(case, ev.WorkerStarted, fence.ts, worker=f.target, epoch=fence.epoch + 1)
    assert [d for d in case.discarded("fenced") if d.ts >= fence.ts], "no attempt re-issued"


def kill_all_workers(case: Case) -> None:
    f = _fault(case)
    assert f.target == "all"
    assert {e.worker for e in _after(case, ev.WorkerFenced, f.ts, reason="lost")} \
        == {"w0", "w1", "w2"}


def kill_reward_worker(case: Case) -> None:
    assert not case.discarded("reward_error"), "samples of a lost reward call were failed"
    assert case.injectors[-1]._lost_calls == 0, "the lost calls never happened"


def duplicate_reward(case: Case) -> None:
    assert len(case.rejected("duplicate")) == 3


def fail_reward(case: Case) -> None:
    f = _fault(case)
    (inj,) = case.injectors
    failed = set(inj.failed[0])
    assert failed, "no sample was failed"
    tagged = {d.sample for d in case.discarded("reward_error")
              if "chaos fault #0 fail_reward" in d.detail}
    assert tagged == failed  # readable from the ledger: the discard names the fault
    assert all("sim raised InjectedFailure" in d.detail for d in case.discarded("reward_error"))
    assert not failed & case.committed_samples(), "a failed sample was committed"
    assert all(e.ts >= f.ts for e in case.discarded("reward_error"))
    rewarded = {e.sample for e in case.of(ev.Rewarded)}
    assert not failed & rewarded, "a failed sample got a reward"


def malformed_reward(case: Case) -> None:
    details = [d.detail for d in case.discarded("reward_error")]
    assert any("nan" in d for d in details), details
    assert any("'0.5'" in d for d in details), details
    assert any("scores for" in d for d in details), details
    assert not {d.sample for d in case.discarded("reward_error")} & case.committed_samples()


def _resumed(case: Case) -> None:
    assert len(case.of(ev.Opened)) == 2
    assert len(case.of(ev.Committed)) == 24
    samples = [s for e in case.of(ev.Committed) for s in e.samples]
    assert len(samples) == len(set(samples)), "a sample was trained twice"


def kill_process(case: Case) -> None:
    assert isinstance(case.errors[0], Killed)
    _resumed(case)


def trainer_crash(case: Case) -> None:
    assert isinstance(case.errors[0], Killed)
    _resumed(case)
    committed = {e.lease for e in case.of(ev.Committed)}
    crashed = [e for e in case.of(ev.Leased) if e.lease not in committed]
    assert crashed and {e.lease for e in case.of(ev.LeaseReleased)} >= {
        e.lease for e in crashed}, "the crashed trainer's lease was not released"
    assert "between the lease of step 4" in _fault(case).detail


def interrupt(case: Case) -> None:
    assert isinstance(case.errors[0], Interrupted)
    assert [e.reason for e in case.of(ev.Closed)] == ["interrupted", "done"]
    _resumed(case)


def version_bump(case: Case) -> None:
    fake = re.search(r"published (\S+) ", _fault(case).detail)
    assert fake
    assert not [e for e in case.of(ev.Started) if e.version == fake.group(1)]
    assert fake.group(1) not in {e.version for e in case.of(ev.Committed)}
    assert _after(case, ev.Started, _fault(case).ts), "generation stopped"


def version_burst(case: Case) -> None:
    instant = [e for e in case.of(ev.Committed) if e.train_s == 0.0]
    assert len(instant) == 3


def delay_weights(case: Case) -> None:
    f = _fault(case)
    assert [e for e in _after(case, ev.WeightsLoaded, f.ts) if e.transfer_s >= 5.0]


def fail_weights(case: Case) -> None:
    f = _fault(case)
    assert _after(case, ev.WorkerFenced, f.ts, worker=f.target, reason="lost")


def stall_weights(case: Case) -> None:
    f = _fault(case)
    assert _after(case, ev.WorkerFenced, f.ts, worker=f.target, reason="timeout")


def _held_ends(case: Case) -> list[str]:
    (held,) = case.injectors[0].held
    assert not [g for g in case.of(ev.Generated) if g.sample == held], "held, yet generated"
    return [d.reason for d in case.of(ev.Discarded) if d.sample == held]


def hold_group(case: Case) -> None:
    assert _held_ends(case) == ["fenced"]  # the generate timeout fenced its worker
    assert [e for e in case.of(ev.WorkerFenced) if e.reason == "timeout"]


def hold_group_deadline(case: Case) -> None:
    assert _held_ends(case) == ["deadline"]  # cut by its group's deadline, before a timeout
    assert all(e.reason != "timeout" for e in case.of(ev.WorkerFenced))


def delay_messages(case: Case) -> None:
    started = {e.sample: e.ts for e in case.of(ev.Started)}
    f = _fault(case)
    late = [g for g in _after(case, ev.Generated, f.ts) if g.ts - started[g.sample] > g.gen_s + 4]
    assert late, "no completion arrived late"


def reorder_messages(case: Case) -> None:
    assert case.injectors[0]._reorder[0].left == 0, "no call was reordered"


def duplicate_messages(case: Case) -> None:
    assert len(case.rejected("duplicate")) == 3


def malformed_completion(case: Case) -> None:
    details = [d.detail for d in case.discarded("invalid")]
    assert len(details) == 4, details
    for what in ("token count -3", "text is NoneType", "gen_s nan", "not a Completion (dict)"):
        assert any(what in d for d in details), (what, details)


def stall_trainer(case: Case) -> None:
    ts = [e.ts for e in case.of(ev.Committed)]
    assert max(b - a for a, b in itertools.pairwise(ts)) >= 30.0


def slow_rewards(case: Case) -> None:
    f = _fault(case)
    before = max(e.reward_s for e in case.of(ev.Rewarded) if e.ts < f.ts)
    during = max(e.reward_s for e in _after(case, ev.Rewarded, f.ts) if e.ts < f.ts + 30)
    assert during > 2 * before


#: kind -> (trigger, fault keys, evidence)
KINDS: dict[str, tuple[dict[str, Any], dict[str, Any], Callable[[Case], None]]] = {
    "stall_worker": (STEP, {}, stall_worker),
    "kill_worker": ({"s": 30}, {}, kill_worker),
    "kill_all_workers": ({"step": 4}, {}, kill_all_workers),
    "kill_reward_worker": ({"step": 2}, {"count": 2}, kill_reward_worker),
    "slow_rewards": ({"step": 2}, {"factor": 5}, slow_rewards),
    "duplicate_reward": ({"step": 2}, {"count": 3}, duplicate_reward),
    "fail_reward": ({"step": 2}, {"share": 0.5, "duration_s": 10}, fail_reward),
    "malformed_reward": ({"step": 2}, {"count": 3}, malformed_reward),
    "kill_process": ({"step": 5}, {}, kill_process),
    "interrupt": ({"s": 40}, {}, interrupt),
    "trainer_crash": (STEP, {}, trainer_crash),
    "version_bump": (STEP, {}, version_bump),
    "version_burst": (STEP, {"count": 3}, version_burst),
    "delay_weights": (STEP, {"target": "all", "delay_s": 5}, delay_weights),
    "fail_weights": (STEP, {}, fail_weights),
    "stall_weights": (STEP, {}, stall_weights),
    "hold_group": (STEP, {}, hold_group),
    "delay_messages": (STEP, {"target": "all", "delay_s": 5}, delay_messages),
    "reorder_messages": (STEP, {"target": "all"}, reorder_messages),
    "duplicate_messages": (STEP, {"target": "all", "count": 3}, duplicate_messages),
    "malformed_completion": (STEP, {"target": "all", "count": 4}, malformed_completion),
    "stall_trainer": (STEP, {}, stall_trainer),
}


def test_every_fault_kind_has_a_case():
    # environment faults need a tool: tests/chaos/test_env_faults.py runs them (tool placement)
    assert set(KINDS) == set(FAULT_KINDS) - ENV_KINDS


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_fault_fires_once_is_recorded_and_leaves_its_evidence(kind: str, tmp_path: Path):
    at, keys, evidence = KINDS[kind]
    case = run_case(scenario(kind, at, **keys), 0, tmp_path)
    assert case.verify is not None and case.verify.ok, dict(case.verify.violations)
    (fault,) = case.faults()
    assert fault.fault == kind
    assert fault.detail.startswith("#0 ")
    assert (kind in PROCESS_KINDS) == bool(case.errors)
    if case.errors:  # a process fault: resumed once, with the fired fault skipped
        assert len(case.injectors) == 2 and case.injectors[1].skip == {0}
        assert not case.injectors[1].fired
    else:
        assert case.injectors[0].fired == [0]
    evidence(case)


def test_a_held_request_is_cut_by_the_group_deadline(tmp_path: Path):
    sc = scenario("hold_group", STEP, workload={"tail": {"deadline": True}})
    case = run_case(sc, 0, tmp_path)
    assert case.verify is not None and case.verify.ok
    hold_group_deadline(case)


def test_a_kill_at_a_generate_hand_off_hits_that_call_after_half_of_it(tmp_path: Path):
    sc = scenario("kill_worker", {"handoff": "generate", "nth": 12})
    case = run_case(sc, 1, tmp_path)
    assert case.verify is not None and case.verify.ok
    f = _fault(case)
    assert "at generate #12" in f.detail and "dies after" in f.detail
    kill_worker(case)


def test_a_random_target_depends_on_the_seed_only(tmp_path: Path):
    sc = scenario("kill_worker", {"step": 2})
    targets = [_fault(run_case(sc, seed, tmp_path / str(seed))).target for seed in range(6)]
    again = [_fault(run_case(sc, seed, tmp_path / f"{seed}b")).target for seed in range(6)]
    assert targets == again
    assert len(set(targets)) > 1  # not always the same worker


@pytest.mark.parametrize("kind", ["stall_worker", "delay_messages", "kill_reward_worker",
                                  "hold_group", "fail_reward"])
def test_the_same_seed_gives_the_same_ledger(kind: str, tmp_path: Path):
    at, keys, _ = KINDS[kind]
    sc = scenario(kind, at, **keys)
    a = run_case(sc, 3, tmp_path / "a")
    b = run_case(sc, 3, tmp_path / "b")
    assert event_key(a.events) == event_key(b.events)
    c = run_case(sc, 4, tmp_path / "c")
    assert event_key(c.events) != event_key(a.events)


def test_a_fault_that_ends_the_process_needs_on_kill():
    sc = scenario("kill_process", STEP)
    with pytest.raises(ConfigError, match="needs on_kill"):
        Injector(sc, 0)
    Injector(sc, 0, skip=frozenset({0}))  # already fired: nothing to kill
    Injector(sc, 0, on_kill=on_kill)


def test_detached_work_is_cancelled_when_the_run_ends(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture):
    # a zombie and delayed completions still under way when the last step commits
    sc = scenario("stall_worker", {"s": 100.0}, delay_s=1000.0)
    case = run_case(sc, 0, tmp_path)
    assert case.verify is not None and case.verify.ok
    (inj,) = case.injectors
    assert inj.closing and not inj._tasks and not inj._timers
    assert "was destroyed but it is pending" not in caplog.text


def test_two_faults_fire_in_order_and_each_is_recorded(tmp_path: Path):
    from freshroll.chaos.plan import Scenario

    sc = Scenario.model_validate({"name": "combo", "faults": [
        {"kind": "version_burst", "at": {"step": 4}, "count": 3},
        {"kind": "kill_worker", "at": {"step": 5}},
    ]})
    case = run_case(sc, 0, tmp_path)
    assert case.verify is not None and case.verify.ok
    assert [f.detail[:3] for f in case.faults()] == ["#0 ", "#1 "]


def test_the_library_loads_with_at_least_16_scenarios_of_known_kinds():
    plan = load_plan(LIBRARY)
    assert len(plan.scenarios) >= 16
    kinds = {f.kind for s in plan.scenarios for f in s.faults}
    assert kinds == set(FAULT_KINDS)  # every kind has a scenario
    assert all(f.kind in FAULT_KINDS for s in plan.scenarios for f in s.faults)
    assert 2 <= sum(s.real for s in plan.scenarios) <= 3
    stops = [s for s in plan.scenarios if s.expect == "stops"]
    assert stops and all(s.error for s in stops)


@pytest.mark.slow
@pytest.mark.parametrize("name", [s.name for s in load_plan(LIBRARY).scenarios
                                  if not s.env_faults])  # those: tests/chaos/test_env_faults.py
def test_library_scenario_leaves_its_evidence(name: str, tmp_path: Path):
    """Each library scenario's fault leaves what its kind must leave in the ledger (the
    evidence of inject_support), on three seeds; the zero-violation sweep over 20 seeds is
    tests/chaos/test_library.py's (the chaos runner's checks, not these)."""
    plan = load_plan(LIBRARY)
    (sc,) = [s for s in plan.scenarios if s.name == name]
    for seed in range(3):
        case = run_case(sc, seed, tmp_path, plan)
        assert case.verify is not None and case.verify.ok, (seed, dict(case.verify.violations))
        assert case.fired() == set(range(len(sc.faults))), seed
        final = case.errors[-1] if case.errors else None
        if sc.expect == "stops":
            assert final is not None and sc.error and sc.error in str(final), (seed, final)
        else:
            assert final is None or isinstance(final, Killed | Interrupted), (seed, final)
            assert not evidence(case, sc), (seed, evidence(case, sc))


def test_an_engine_with_a_real_kill_is_killed_for_real(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    from freshroll.sim.engine import SimEngine

    killed: list[str] = []

    async def kill(self: SimEngine) -> None:  # as the Ray adapter's: the actor dies
        killed.append(self.name)
        await self.close()  # every open call raises WorkerLost (the engine's own)

    monkeypatch.setattr(SimEngine, "kill", kill, raising=False)
    case = run_case(scenario("kill_worker", {"s": 30}), 0, tmp_path)
    assert case.verify is not None and case.verify.ok
    f = _fault(case)
    assert killed == [f.target] and "for real (SimEngine.kill())" in f.detail
    kill_worker(case)


def test_the_liveness_guard_stops_a_run_that_hangs(tmp_path: Path):
    from freshroll import unsafe
    from freshroll.errors import RunFailed

    sc = scenario("stall_weights", STEP, target="all")
    previous = unsafe.set_broken(["timeouts"])  # nothing ends the stuck weight loads
    try:
        case = run_case(sc, 0, tmp_path)
    finally:
        unsafe.set_broken(previous)
    assert case.errors and isinstance(case.errors[-1], RunFailed)
    assert "made no progress for 600 s" in str(case.errors[-1])
    assert case.verify is not None and case.verify.ok  # closed and verifiable
    fixed = run_case(sc, 0, tmp_path / "with-timeouts")
    assert not fixed.errors and fixed.verify is not None and fixed.verify.ok


@pytest.mark.parametrize("handoff", sorted(HANDOFFS))
def test_every_named_hand_off_can_trigger_a_fault(handoff: str, tmp_path: Path):
    sc = scenario("stall_trainer", {"handoff": handoff, "nth": 2}, duration_s=1.0)
    case = run_case(sc, 0, tmp_path)
    assert case.verify is not None and case.verify.ok
    assert _fault(case).detail.startswith(f"#0 at {handoff} #2: ")
    assert case.injectors[0].counts[handoff] >= 2


def test_a_samples_trigger_fires_at_that_completion(tmp_path: Path):
    case = run_case(scenario("stall_trainer", {"samples": 50}, duration_s=1.0), 0, tmp_path)
    seq = case.events.index(_fault(case))
    assert sum(isinstance(e, ev.Generated) for e in case.events[:seq]) == 49  # the 50th next

