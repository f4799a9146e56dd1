"""The gates, pure: measured values per repeat in, pass/fail with spread and evidence out."""

from __future__ import annotations

import math
import statistics

import pytest

from freshroll.validate.acceptance import parse
from freshroll.validate.gates import (
    Case,
    Criterion,
    Measured,
    Repeat,
    Spread,
    bound_gate,
    convergence_gate,
    evaluate,
    failed,
    learning_gates,
    ratio_gate,
    recovery_gates,
    verify_gate,
)


def rep(mode: str, seed: int, ok: bool = True, **figs: float | None) -> Repeat:
    base: dict[str, float | None] = {
        "accepted_per_s": 100.0, "discard_rate": 0.05, "lag_p99": 1.0, "lag_max": 1.0,
        "trainer_idle_ratio": 0.02, "reward_window": 0.5}
    base.update(figs)
    return Repeat(f"{mode}-seed{seed}", mode, seed, f"/out/{mode}-seed{seed}", base,  # type: ignore[arg-type]
                  ok=ok, problem=None if ok else "the run failed: budget")


def test_spread() -> None:
    s = Spread.of([1.0, 2.0, 4.0])
    assert (s.n, s.mean, s.min, s.max) == (3, pytest.approx(7 / 3), 1.0, 4.0)
    assert s.stdev == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))
    one = Spread.of([3.0, None])
    assert (one.n, one.stdev, one.missing) == (1, None, 1)


def test_at_most_passes_and_fails_on_the_worst_repeat() -> None:
    runs = [rep("async", 0, discard_rate=0.1), rep("async", 1, discard_rate=0.25)]
    c = bound_gate("discard_rate", "d", "<=", 0.2, runs, "discard_rate")
    assert not c.passed and c.value == 0.25  # one repeat over the threshold fails the gate
    assert c.spread is not None and c.spread.mean == pytest.approx(0.175)
    assert c.evidence == ("/out/async-seed0", "/out/async-seed1")
    assert dict(c.per_repeat) == {"async-seed0": 0.1, "async-seed1": 0.25}
    assert bound_gate("discard_rate", "d", "<=", 0.25, runs, "discard_rate").passed


def test_at_least_reads_the_minimum() -> None:
    runs = [rep("async", 0, accepted_per_s=90.0), rep("async", 1, accepted_per_s=120.0)]
    c = bound_gate("accepted_per_s", "a", ">=", 100.0, runs, "accepted_per_s")
    assert not c.passed and c.value == 90.0
    assert bound_gate("accepted_per_s", "a", ">=", 90.0, runs, "accepted_per_s").passed


def test_a_missing_figure_fails_the_gate() -> None:
    runs = [rep("async", 0), rep("async", 1, trainer_idle_ratio=None)]
    c = bound_gate("trainer_idle_ratio", "i", "<=", 0.5, runs, "trainer_idle_ratio")
    assert not c.passed and "no figure for async-seed1" in c.note
    assert not bound_gate("x", "x", "<=", 1.0, [], "lag_max").passed  # nothing measured


def test_verify_gate() -> None:
    good = [rep("async", 0), rep("sync", 0)]
    assert verify_gate(good).passed
    c = verify_gate([*good, rep("async", 1, ok=False)])
    assert not c.passed and c.value == 1.0
    assert c.evidence == ("/out/async-seed1",) and "async-seed1: the run failed" in c.note
    assert not verify_gate([]).passed


def test_ratio_is_paired_by_seed() -> None:
    a = [rep("async", 0, accepted_per_s=150.0), rep("async", 1, accepted_per_s=90.0)]
    s = [rep("sync", 1, accepted_per_s=100.0), rep("sync", 0, accepted_per_s=100.0)]
    c = ratio_gate(1.0, a, s)
    assert dict(c.per_repeat) == {"seed0": pytest.approx(1.5), "seed1": pytest.approx(0.9)}
    assert not c.passed and c.value == pytest.approx(0.9)
    assert ratio_gate(0.9, a, s).passed
    assert not ratio_gate(0.5, a, s[:1]).passed  # seed 0 has no baseline


def test_convergence_tolerance_absolute_and_in_baseline_spread() -> None:
    a = [rep("async", k, reward_window=v) for k, v in enumerate([0.40, 0.50, 0.45])]
    s = [rep("sync", k, reward_window=v) for k, v in enumerate([0.50, 0.60, 0.55])]
    # mean difference -0.10; baseline stdev 0.05
    c = convergence_gate(10, 0.05, None, False, a, s)
    assert c.value == pytest.approx(-0.10) and not c.passed and c.limit == -0.05
    c = convergence_gate(10, 0.05, 2.5, False, a, s)  # tol = max(0.05, 2.5 x 0.05) = 0.125
    assert c.limit == pytest.approx(-0.125) and c.passed
    assert "tolerance 0.125" in c.note
    c = convergence_gate(10, None, 1.0, False, a, s)  # tol 0.05
    assert not c.passed


def test_convergence_one_sided_unless_two_sided() -> None:
    a = [rep("async", k, reward_window=0.9) for k in range(2)]
    s = [rep("sync", k, reward_window=0.5) for k in range(2)]
    assert convergence_gate(5, 0.1, None, False, a, s).passed  # better is not a failure
    c = convergence_gate(5, 0.1, None, True, a, s)
    assert not c.passed and c.value == pytest.approx(0.4) and c.op == "<="


def test_recovery_gates() -> None:
    cases = [Case("kill", 0, "/r/kill/0", 12.0), Case("kill", 1, "/r/kill/1", 30.0),
             Case("stall", 0, "/r/stall/0", None),
             Case("stall", 1, "/r/stall/1", 5.0, ("duplicates: sample x committed twice",))]
    kill, stall, inv = recovery_gates(20.0, ["kill", "stall"], cases)
    assert kill.name == "recovery_s[kill]" and not kill.passed and kill.value == 30.0
    assert stall.value == math.inf and not stall.passed and "seed 0: never recovered" in stall.note
    assert inv.name == "chaos_invariants" and not inv.passed and inv.value == 1.0
    assert inv.evidence == ("/r/stall/1",)
    ok = recovery_gates(60.0, ["kill"], cases[:2])
    assert all(c.passed for c in ok)


def test_recovery_unavailable_fails_with_the_reason() -> None:
    out = recovery_gates(10.0, ["kill"], "the chaos runner is not available")
    assert [c.name for c in out] == ["recovery_s[kill]", "chaos_invariants"]
    assert all(not c.passed and "not available" in c.note for c in out)


def test_evaluate_runs_every_configured_gate_verify_first() -> None:
    spec = parse({"gates": {
        "accepted_per_s": {"min": 50, "min_ratio_to_sync": 1.2},
        "discard_rate": {"max": 0.2}, "lag_p99": {"max": "max_staleness"},
        "lag_max": {"max": "max_staleness"}, "trainer_idle_ratio": {"max": 0.1},
        "convergence": {"last_steps": 3, "tolerance": 0.05},
        "recovery": {"plan": "p.yaml", "scenarios": ["kill"], "max_s": 60}}}, "x")
    m = Measured([rep("async", 0, accepted_per_s=150.0, lag_max=2.0)],
                 [rep("sync", 0, accepted_per_s=100.0)], [Case("kill", 0, "/r", 3.0)])
    out = evaluate(spec.gates, 1, m)
    assert [c.name for c in out] == [
        "verify", "accepted_per_s", "accepted_per_s_ratio", "discard_rate", "lag_p99",
        "lag_max", "trainer_idle_ratio", "recovery_s[kill]", "chaos_invariants",
        "convergence_parity"]
    assert failed(out) == ["lag_max"]  # lag 2 > max_staleness 1
    assert evaluate(spec.gates, 2, m) and not failed(evaluate(spec.gates, 2, m))


def test_criterion_json_round_trip_keeps_infinity() -> None:
    cases = [Case("stall", 0, "/r", None), Case("stall", 1, "/r1", 2.0)]
    c = recovery_gates(5.0, ["stall"], cases)[0]
    js = c.to_json()
    assert js["value"] == "inf" and js["threshold"] == "<= 5"
    assert Criterion.from_json(js) == c


def test_the_learning_gates_count_collapses_and_read_the_worst_mismatch_kl() -> None:
    runs = [rep("async", 0, collapsed=0.0, mismatch_kl_stale=0.01),
            rep("async", 1, collapsed=1.0, mismatch_kl_stale=0.05)]
    collapses, kl = learning_gates(0, 0.04, runs)
    assert collapses.name == "collapses" and not collapses.passed and collapses.value == 1.0
    assert collapses.evidence == ("/out/async-seed1",) and "async-seed1" in collapses.note
    assert kl.name == "mismatch_kl_stale" and not kl.passed and kl.value == 0.05
    fine = [rep("async", 0, collapsed=0.0, mismatch_kl_stale=0.01)]
    assert all(c.passed for c in learning_gates(0, 0.04, fine))
    assert [c.name for c in learning_gates(1, None, runs)] == ["collapses"]
    assert learning_gates(1, None, runs)[0].passed  # one collapse allowed
    unknown = learning_gates(0, None, [rep("async", 0, collapsed=None)])[0]
    assert not unknown.passed and "no figure for async-seed0" in unknown.note


def test_the_learning_gate_is_evaluated_when_configured() -> None:
    spec = parse({"gates": {"learning": {"max_mismatch_kl": 0.04}}}, "a.yaml")
    m = Measured(async_runs=[rep("async", 0, collapsed=0.0, mismatch_kl_stale=0.02)])
    names = [c.name for c in evaluate(spec.gates, 1, m)]
    assert names == ["verify", "collapses", "mismatch_kl_stale"]
