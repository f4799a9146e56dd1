"""The shipped chaos library in CI: every scenario over 5 seeds with zero violations (`make
chaos` runs the 20 seeds of docs/chaos.md's table: 4x the suite's ~280 s of two cores), and the
broken builds: each protection's scenario reports a violation on a build without it."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from freshroll.chaos import checks, runner
from freshroll.chaos.plan import FAULT_KINDS, load_plan
from freshroll.chaos.table import write_tables

LIBRARY = Path(__file__).parents[2] / "chaos" / "library.yaml"
SEEDS = range(5)


def test_the_library_loads_and_covers_every_fault_kind() -> None:
    plan = load_plan(LIBRARY)
    kinds = {f.kind for s in plan.scenarios for f in s.faults}
    assert kinds == set(FAULT_KINDS)
    assert any(s.expect == "stops" for s in plan.scenarios)
    assert any(s.process_fault for s in plan.scenarios)


@pytest.mark.slow
def test_every_scenario_over_5_seeds_has_zero_violations(tmp_path: Path) -> None:
    plan = load_plan(LIBRARY)
    t0 = time.perf_counter()
    jobs = min(4, os.cpu_count() or 1)  # the seeds shared out among worker processes
    results = runner.run_plan(plan, SEEDS, tmp_path, progress=sys.stderr, jobs=jobs)
    wall = time.perf_counter() - t0
    table = write_tables(results, tmp_path, header={"wall_s": round(wall, 1)})
    sys.stderr.write(f"\nchaos library: {len(results)} cases in {wall:.1f} s ({jobs} jobs)\n"
                     f"{table}")
    # environment faults run on the tool placement: tests/chaos/test_env_faults.py
    assert len(results) == sum(not s.env_faults for s in plan.scenarios) * len(SEEDS)
    bad = [(r.scenario, r.seed, v.invariant, v.message) for r in results for v in r.violations]
    assert bad == []
    for r in results:
        assert r.faults_injected == r.faults_planned, (r.scenario, r.seed)
        scen = next(s for s in plan.scenarios if s.name == r.scenario)
        assert (r.outcome == "finished") == (scen.expect == "recovers"), (r.scenario, r.outcome)
        if scen.process_fault:
            assert r.incarnations > 1, (r.scenario, r.seed)
    # reward_failures checked something: the failed samples are named in the ledger
    named = {r.scenario: _named_failures(r.run_dir) for r in results if r.seed == 0
             and any(f.kind in checks.REWARD_FAILURES
                     for f in next(s for s in plan.scenarios if s.name == r.scenario).faults)}
    assert named and all(n > 0 for n in named.values()), named


def _named_failures(run_dir: Path) -> int:
    from freshroll.ledger import events as ev

    return sum(len(re.findall(r"g\d+\.\d+#\d+", e.detail)) for e in runner.read_events(run_dir)
               if isinstance(e, ev.FaultInjected) and e.fault in checks.REWARD_FAILURES)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["worker-stall", "process-killed", "trainer-crash"])
def test_the_same_seed_writes_the_same_ledger(tmp_path: Path, name: str) -> None:
    plan = load_plan(LIBRARY)
    scen = next(s for s in plan.scenarios if s.name == name)
    with runner.ChildPool() as pool:
        a = runner.run_case(plan, scen, 4, tmp_path / "a", children=pool)
        b = runner.run_case(plan, scen, 4, tmp_path / "b", children=pool)
    assert a.ok and b.ok
    assert a.ledger_digest == b.ledger_digest


#: protection switched off -> its library scenario, the invariant that must catch it, seeds
BROKEN = [
    ("fencing", "worker-stall", {"fencing"}, (0, 1, 2)),
    ("fencing", "zombie-and-bump", {"fencing"}, (0,)),
    ("dedup", "reward-twice", {"duplicates"}, (0, 1, 2)),
    ("dedup", "messages-duplicated", {"duplicates"}, (0, 1, 2)),
    ("timeouts", "all-weights-stalled", {"liveness"}, (0, 1)),
    ("budget", "reward-fails-always", {"liveness", "expected_outcome"}, (0,)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("switch", "name", "invariants", "seeds"), BROKEN,
                         ids=[f"{b[0]}-{b[1]}" for b in BROKEN])
def test_a_build_without_a_protection_fails_its_scenario(
    tmp_path: Path, switch: str, name: str, invariants: set[str], seeds: tuple[int, ...]
) -> None:
    plan = load_plan(LIBRARY)
    clean = runner.run_plan(plan, seeds[:1], tmp_path / "clean", only=[name])
    assert all(r.ok for r in clean), [r.violations for r in clean]  # the build with it passes
    results = runner.run_plan(plan, seeds, tmp_path / "broken", only=[name], broken=[switch])
    for r in results:
        found = {v.invariant for v in r.violations}
        assert found & invariants, (switch, name, r.seed, r.violations)


def test_break_switches_are_restored_after_a_case(tmp_path: Path) -> None:
    from freshroll import unsafe

    with runner.broken_switches(["dedup"]):
        assert unsafe.broken("dedup")
    assert not unsafe.BROKEN
