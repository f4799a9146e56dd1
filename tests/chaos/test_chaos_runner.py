"""The chaos runner's machinery: twins, incarnations (resume, a real SIGKILL in a child),
the liveness guard, determinism (the same seed gives the same ledger digest)."""

from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path

import pytest

from freshroll.chaos import runner
from freshroll.chaos.digest import digest_events, ledger_digest
from freshroll.chaos.plan import BASE_WORKLOAD, parse_plan
from freshroll.config import validate
from freshroll.errors import ConfigError

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from child_support import INJECTOR, child_path  # noqa: E402, F401  (child_path: autouse)

PLAN = parse_plan({"scenarios": [
    {"name": "interrupt", "faults": [{"kind": "interrupt", "at": {"step": 3}}]},
    {"name": "kill", "faults": [{"kind": "kill_process", "at": {"step": 5}},
                                {"kind": "interrupt", "at": {"step": 9}}]},
    {"name": "stall", "faults": [{"kind": "stall_trainer", "at": {"step": 4},
                                  "duration_s": 1e6}]},
]}, "test plan")


def case(name: str, seed: int, out: Path, **kw: object) -> runner.CaseResult:
    scen = next(s for s in PLAN.scenarios if s.name == name)
    return runner.run_case(PLAN, scen, seed, out, injector=INJECTOR, **kw)  # type: ignore[arg-type]


def test_an_interrupt_is_resumed_in_process_and_checked(tmp_path: Path) -> None:
    r = case("interrupt", 0, tmp_path)
    assert r.ok, r.violations
    assert (r.incarnations, r.faults_injected, r.faults_planned) == (2, 1, 1)
    assert r.outcome == "finished"
    assert r.recovery_s is not None and r.recovery_s > 0
    assert r.throughput_ratio is not None and 0.5 < r.throughput_ratio < 1.5
    assert r.baseline_dir.name.endswith("-seed-0") and r.run_dir == tmp_path / "sim" / \
        "interrupt" / "seed-0" / "run"


def test_the_same_seed_gives_the_same_digest_and_another_seed_another(tmp_path: Path) -> None:
    a = case("interrupt", 1, tmp_path / "a")
    b = case("interrupt", 1, tmp_path / "b")
    c = case("interrupt", 2, tmp_path / "c")
    assert a.ledger_digest == b.ledger_digest != c.ledger_digest
    assert len(a.ledger_digest) == 64


@pytest.mark.slow
def test_a_sigkill_child_is_resumed_and_deterministic(tmp_path: Path) -> None:
    with runner.ChildPool() as pool:
        a = case("kill", 0, tmp_path / "a", children=pool)
        b = case("kill", 0, tmp_path / "b", children=pool)
    assert a.ok and b.ok, (a.violations, b.violations)
    assert a.incarnations == 3  # killed, resumed and interrupted, resumed
    assert a.faults_injected == 2
    assert a.ledger_digest == b.ledger_digest
    spec = tmp_path / "a" / "sim" / "kill" / "seed-0" / "child-1.json"
    assert spec.is_file() and not spec.with_suffix(".result.json").exists()  # it was killed


@pytest.mark.slow
def test_an_exec_child_writes_the_same_history_as_a_forked_one(tmp_path: Path) -> None:
    forked = case("kill", 3, tmp_path / "f", children=runner.ChildPool())
    execd = case("kill", 3, tmp_path / "e", children=None)
    assert execd.ok, execd.violations
    assert forked.ledger_digest == execd.ledger_digest


def test_a_run_that_never_finishes_is_a_liveness_violation(tmp_path: Path) -> None:
    r = case("stall", 0, tmp_path)
    assert [v.invariant for v in r.violations][:1] == ["liveness"]
    msg = r.violations[0].message  # the Injector's no-progress guard, or the runner's horizon
    assert "made no progress" in msg or "did not finish within" in msg
    assert "expected_outcome" not in {v.invariant for v in r.violations}
    assert r.outcome.startswith("stopped: liveness")


def test_the_horizon_stops_a_run_that_outlasts_it(tmp_path: Path) -> None:
    # the fault-free run takes ~110 s of run time: a horizon of 20 s ends it
    with pytest.raises(runner.LivenessTimeout, match="did not finish within 20 s"):
        runner.run_in_process(validate(BASE_WORKLOAD, "base"), tmp_path / "r", False,
                              runner.Guard(None, 20.0))
    status, detail = runner.outcome_of(runner.LivenessTimeout("liveness: x"))
    assert (status, detail) == ("liveness", "liveness: x")
    from freshroll.errors import RunFailed

    assert runner.outcome_of(RunFailed("chaos: the run made no progress for 600 s"))[0] == \
        "liveness"
    assert runner.outcome_of(RunFailed("budget spent"))[0] == "stopped"
    assert runner.outcome_of(KeyError("x")) == ("stopped", "KeyError: 'x'")


def test_a_child_past_its_wall_clock_limit_is_a_liveness_violation(tmp_path: Path) -> None:
    r = case("kill", 0, tmp_path, children=None, child_timeout_s=0.5)
    assert r.violations and r.violations[0].invariant == "liveness"
    assert "wall time" in r.violations[0].message


def test_scenarios_share_one_twin_per_seed(tmp_path: Path) -> None:
    out = io.StringIO()
    results = runner.run_plan(PLAN, [0], tmp_path, only=["interrupt", "stall"], progress=out,
                              injector=INJECTOR)
    assert [r.scenario for r in results] == ["interrupt", "stall"]
    assert len({r.baseline_dir for r in results}) == 1
    assert len(list((tmp_path / "sim" / "baselines").iterdir())) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("chaos interrupt seed 0 [sim]: ok")
    assert "1 violation(s): liveness" in lines[1] or "violation(s): liveness" in lines[1]


def test_a_second_chaos_run_replaces_its_case_directories(tmp_path: Path) -> None:
    case("interrupt", 0, tmp_path)
    again = case("interrupt", 0, tmp_path)
    assert again.ok


def test_a_foreign_directory_is_not_removed(tmp_path: Path) -> None:
    mine = tmp_path / "sim" / "interrupt" / "seed-0"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="not a chaos case directory"):
        case("interrupt", 0, tmp_path)
    assert (mine / "notes.txt").read_text() == "keep"


def test_unknown_only_and_real_placements_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no scenario named nope"):
        runner.select(PLAN, ["nope"])
    with pytest.raises(ConfigError, match="placement 'moon'"):
        runner.workload_for(PLAN, PLAN.scenarios[0], 0, "moon")


def test_the_digest_ignores_the_run_name_and_path(tmp_path: Path) -> None:
    from freshroll.runtime.run import run

    for name in ("one", "two"):
        run(validate(BASE_WORKLOAD, "base"), tmp_path / name, stream=io.StringIO(),
            report=False)
    assert ledger_digest(tmp_path / "one") == ledger_digest(tmp_path / "two")
    events = runner.read_events(tmp_path / "one")
    assert digest_events(events) != digest_events(events[:-1])
    # real time: the timestamps are dropped, the order of events kept
    shifted = [e.__class__(**{**{f: getattr(e, f) for f in e.__struct_fields__},
                              "ts": e.ts + 1.0}) for e in events]
    assert digest_events(shifted) != digest_events(events)
    assert digest_events(shifted, timing=False) == digest_events(events, timing=False)
    shutil.rmtree(tmp_path / "two")


@pytest.mark.slow
def test_jobs_share_out_the_seeds_and_keep_the_order_and_the_histories(tmp_path: Path) -> None:
    serial = runner.run_plan(PLAN, [0, 1, 2], tmp_path / "one", only=["interrupt", "stall"],
                             injector=INJECTOR)
    out = io.StringIO()
    parallel = runner.run_plan(PLAN, [0, 1, 2], tmp_path / "two", only=["interrupt", "stall"],
                               injector=INJECTOR, jobs=2, progress=out)
    key = [(r.scenario, r.seed) for r in serial]
    assert [(r.scenario, r.seed) for r in parallel] == key
    assert [r.ledger_digest for r in parallel] == [r.ledger_digest for r in serial]
    assert [[v.invariant for v in r.violations] for r in parallel] == \
        [[v.invariant for v in r.violations] for r in serial]
    assert len(out.getvalue().splitlines()) == 6
    assert parallel[0].run_dir.is_relative_to(tmp_path / "two")


@pytest.mark.slow
def test_a_worker_process_forks_every_seeds_kills_from_one_zygote(tmp_path: Path) -> None:
    """``jobs`` > 1: a worker process runs its seeds' kill incarnations as forks of one zygote
    (a zygote costs a Python start-up, its imports and a warm-up run), kept across its seeds
    and closed when the worker exits; a zygote of other ``broken`` switches is another one."""
    def task(seed: int, broken: list[str]) -> list[runner.CaseResult]:
        args = (PLAN.model_dump(mode="json"), seed, str(tmp_path / f"s{seed}"), ["kill"],
                ["sim"], broken, INJECTOR, runner.CHILD_TIMEOUT_S, True)
        return [runner.case_from_json(c) for c in runner._seed_task(args)]

    assert runner._WORKER_CHILDREN == {}
    try:
        first = task(0, [])
        pool = runner._WORKER_CHILDREN[()]
        assert pool.proc is not None and pool.proc.poll() is None  # kept after the seed
        zygote = pool.proc.pid
        second = task(1, [])
        assert runner._WORKER_CHILDREN[()] is pool and pool.proc.pid == zygote  # the same
        for r in (*first, *second):
            assert r.ok and r.incarnations == 3, (r.seed, r.violations)
        assert runner._worker_children(["dedup"]) is not pool
    finally:
        for p in runner._WORKER_CHILDREN.values():
            p.close()
        runner._WORKER_CHILDREN.clear()
    assert pool.proc is None  # closed


def test_the_digest_is_the_hash_of_every_normalized_event(tmp_path: Path) -> None:
    """``digest_events`` hashes most events' JSON as it is (no walk of their values): the
    same digest as the JSON of ``normalize`` of every event, with the run directory in some
    of them, a path that JSON escapes (a quote, a backslash, a non-ASCII letter), a
    directory name that is in another path but is not the run's, and on both clocks."""
    import hashlib

    import msgspec

    from freshroll.chaos.digest import normalize
    from freshroll.ledger import events as ev
    from freshroll.runtime.run import run

    out = tmp_path / 'r "q" \\ é'
    run(validate(BASE_WORKLOAD, "base"), out, stream=io.StringIO(), report=False)
    run_dir = str(out.resolve())
    events = runner.read_events(out)
    events.append(ev.FaultInjected(ts=1.0, fault="kill_worker", target="w0",
                                   detail=f"{run_dir}/x and {run_dir}-other and {out.name}"))
    enc = msgspec.json.Encoder()
    holding = [e for e in events if enc.encode(run_dir)[1:-1] in enc.encode(e)]
    assert holding and len(holding) < len(events)  # both paths of the digest are taken
    for timing in (True, False):
        want = hashlib.sha256()
        for e in events:
            want.update(enc.encode(normalize(e, run_dir=run_dir, timing=timing)) + b"\n")
        assert digest_events(events, run_dir=run_dir, timing=timing) == want.hexdigest()
        assert "RUN_DIR/x" in str(normalize(events[-1], run_dir=run_dir, timing=timing))
