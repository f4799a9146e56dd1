"""The chaos checks on hand-built ledgers: each passes on a good history and CAN fail."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from freshroll.chaos import checks
from freshroll.chaos.plan import BASE_WORKLOAD, parse_plan
from freshroll.config import validate
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion

V0 = str(PolicyVersion.initial("m"))


def _plan(expect: str = "recovers", error: str | None = None, n: int = 1):
    faults = [{"kind": "interrupt", "at": {"step": 2 + i}} for i in range(n)]
    scen = {"name": "s", "faults": faults, "expect": expect}
    if error:
        scen["error"] = error
    return parse_plan({"scenarios": [scen]}, "t").scenarios[0]


def opened(inc: int, *, eta: int = 1, b: int = 1, limit: int | None = None) -> ev.Opened:
    return ev.Opened(ts=0.0, run_id="r", incarnation=inc, max_staleness=eta, batch_groups=b,
                     group_size=2, max_inflight_groups=limit)


def fault(i: int, kind: str = "interrupt", detail: str = "") -> ev.FaultInjected:
    return ev.FaultInjected(ts=1.0, fault=kind, target="process", detail=f"#{i} {detail}")


def req(k: int, prompt: str = "p") -> ev.Requested:
    return ev.Requested(ts=0.0, group=f"g{k}", prompt_id=prompt, size=2, version=V0)


# -- faults_recorded ----------------------------------------------------------------------
def test_faults_recorded_passes_when_each_fault_fires_once() -> None:
    evs = [opened(0), fault(0), opened(1), fault(1)]
    assert checks.faults_recorded(evs, 2) == []


def test_faults_recorded_fails_on_a_missing_fault() -> None:
    (v,) = checks.faults_recorded([opened(0), fault(0)], 2)
    assert v.invariant == "faults_recorded" and "#1" in v.message and "never" in v.message


def test_faults_recorded_fails_on_a_fault_fired_again_after_a_resume() -> None:
    (v,) = checks.faults_recorded([opened(0), fault(0), opened(1), fault(0)], 1)
    assert "again after a resume" in v.message and "[0, 1]" in v.message


def test_faults_recorded_fails_on_a_record_naming_no_planned_fault() -> None:
    bad = ev.FaultInjected(ts=1.0, fault="x", target="all", detail="no index")
    found = checks.faults_recorded([opened(0), fault(0), bad, fault(5)], 1)
    assert [v.invariant for v in found] == ["faults_recorded"] * 2


def test_fired_indexes_reads_the_detail_prefix() -> None:
    assert checks.fired_indexes([fault(0), fault(3, detail="x"), fault(3)]) == {0, 3}
    assert checks.fault_index("#12 stall w0") == 12
    assert checks.fault_index("#1x") is None and checks.fault_index("stall #1") is None


# -- prompt_sequence ----------------------------------------------------------------------
ORDER = ["a", "b", "c"]


def test_prompt_sequence_passes_across_a_resume_and_wraps_around() -> None:
    evs = [opened(0), req(0, "a"), req(1, "b"), opened(1), req(2, "c"), req(3, "a")]
    assert checks.prompt_sequence(evs, ORDER) == []


def test_prompt_sequence_fails_on_a_prompt_skipped_on_resume() -> None:
    evs = [opened(0), req(0, "a"), opened(1), req(1, "c")]  # b skipped (NeMo-RL #3599)
    (v,) = checks.prompt_sequence(evs, ORDER)
    assert v.invariant == "prompt_sequence" and "incarnation 1" in v.message
    assert "got prompt c" in v.message and "has b" in v.message


def test_prompt_sequence_fails_on_a_group_gap_or_repeat() -> None:
    found = checks.prompt_sequence([opened(0), req(0, "a"), req(2, "c")], ORDER)
    assert any("g2 admitted where g1 was next" in v.message for v in found)
    found = checks.prompt_sequence([opened(0), req(0, "a"), req(1, "b"), req(1, "b")], ORDER)
    assert any("g1 admitted where g2 was next" in v.message for v in found)


def test_prompt_sequence_without_an_order_checks_the_groups_only() -> None:
    assert checks.prompt_sequence([req(0, "z"), req(1, "z")], None) == []


def test_planned_order_is_the_runs_shuffle() -> None:
    cfg = validate(BASE_WORKLOAD, "base")
    order = checks.planned_order(cfg)
    assert order is not None and len(order) == 64 and len(set(order)) == 64
    assert order != sorted(order)
    again = checks.planned_order(cfg.model_copy(update={"run": cfg.run.model_copy(
        update={"seed": 1})}))
    assert again != order


# -- admission_bound ----------------------------------------------------------------------
def ready(k: int) -> ev.Ready:
    return ev.Ready(ts=0.0, group=f"g{k}", samples=[f"g{k}.0#0", f"g{k}.1#0"])


def test_admission_bound_passes_inside_the_window() -> None:
    # eta 1, B 1, version 0: window (1 + 0 + 1) x 1 = 2 groups
    assert checks.admission_bound([opened(0), req(0), req(1)]) == []


def test_admission_bound_fails_past_the_window() -> None:
    (v,) = checks.admission_bound([opened(0), req(0), req(1), req(2)])
    assert v.invariant == "admission_bound" and "window 2" in v.message


def test_admission_bound_counts_accepted_groups_and_frees_discarded_ones() -> None:
    evs = [opened(0), req(0), req(1), ready(0), req(2)]  # accepted 1 + running 2 > 2
    assert len(checks.admission_bound(evs)) == 1
    gone = [ev.Discarded(ts=0.0, request=f"g1.{m}", reason="generation_error")
            for m in range(2)]
    assert checks.admission_bound([opened(0), req(0), req(1), *gone, req(2)]) == []
    fenced = [ev.Discarded(ts=0.0, request="g1.0", sample="g1.0#0", reason="fenced")]
    assert len(checks.admission_bound([opened(0), req(0), req(1), *fenced, req(2)])) == 1


def test_admission_bound_after_a_resume_keeps_the_groups_in_flight() -> None:
    # AReaL #1388: a resume that forgets the groups still running admits past the bound
    evs = [opened(0), req(0), req(1), opened(1), req(2)]
    (v,) = checks.admission_bound(evs)
    assert "incarnation 1" in v.message


def test_admission_bound_checks_the_admission_limit() -> None:
    evs = [opened(0, eta=5, limit=1), req(0), req(1)]
    (v,) = checks.admission_bound(evs)
    assert "admission limit 1" in v.message


def test_admission_bound_a_commit_widens_the_window() -> None:
    committed = ev.Committed(ts=0.0, lease="l0", version=str(PolicyVersion.initial("m").child(
        ["g0.0#0"], "s")), parent=V0, settings_digest="s", samples=["g0.0#0", "g0.1#0"])
    evs = [opened(0), req(0), req(1), ready(0), committed, req(2)]
    assert checks.admission_bound(evs) == []


# -- reward_failures ----------------------------------------------------------------------
def test_reward_failures_passes_when_failed_samples_are_discarded_reward_error() -> None:
    evs = [fault(0, "fail_reward", "failed g1.0#0 g1.1#0"),
           ev.Discarded(ts=0.0, request="g1.0", sample="g1.0#0", reason="reward_error"),
           ev.Discarded(ts=0.0, request="g1.1", sample="g1.1#0", reason="reward_error")]
    assert checks.reward_failures(evs) == []


def test_reward_failures_fails_on_a_committed_or_otherwise_discarded_sample() -> None:
    evs = [fault(0, "malformed_reward", "g1.0#0 g1.1#0"),
           ev.Committed(ts=0.0, lease="l", version="v", parent="p", settings_digest="s",
                        samples=["g1.0#0"]),
           ev.Discarded(ts=0.0, request="g1.1", sample="g1.1#0", reason="shutdown")]
    found = checks.reward_failures(evs)
    assert [v.invariant for v in found] == ["reward_failures"] * 2
    assert "committed" in found[0].message and "discarded shutdown" in found[1].message


def test_reward_failures_ignores_other_fault_kinds() -> None:
    assert checks.reward_failures([fault(0, "kill_worker", "g1.0#0")]) == []


# -- expected_outcome ---------------------------------------------------------------------
def _done(steps: int, reason: str = "done") -> list[ev.Event]:
    c = ev.Committed(ts=0.0, lease="l", version="v", parent="p", settings_digest="s",
                     samples=[])
    return [*[c] * steps, ev.Closed(ts=0.0, reason=reason)]


def test_expected_outcome_recovers() -> None:
    s = _plan()
    assert checks.expected_outcome(s, _done(3), 3, None) == []
    assert "2 of 3" in checks.expected_outcome(s, _done(2), 3, None)[0].message
    assert "stopped" in checks.expected_outcome(s, _done(1, "failed"), 3, "boom")[0].message


def test_expected_outcome_stops() -> None:
    s = _plan("stops", "budget")
    assert checks.expected_outcome(s, _done(1, "failed"), 3, "failure budget spent") == []
    assert "finished" in checks.expected_outcome(s, _done(3), 3, None)[0].message
    assert "stopped with: disk" in checks.expected_outcome(s, _done(1), 3, "disk")[0].message


# -- verify's invariants, and all together ----------------------------------------------------
@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from freshroll.runtime.run import run

    out = tmp_path_factory.mktemp("checks") / "run"
    run(validate(BASE_WORKLOAD, "base"), out, stream=io.StringIO(), report=False)
    return out


def test_check_case_passes_on_a_clean_run_except_the_unfired_fault(sim_run: Path) -> None:
    from freshroll.chaos.runner import read_events

    events = read_events(sim_run)
    cfg = validate(BASE_WORKLOAD, "base")
    found = checks.check_case(_plan(), sim_run, events, steps=cfg.run.steps, error=None,
                              order=checks.planned_order(cfg))
    assert [v.invariant for v in found] == ["faults_recorded"]  # the plan's fault never fired


def test_verify_violations_become_violations(sim_run: Path, tmp_path: Path) -> None:
    import shutil

    assert checks.verify_violations(sim_run) == []
    bad = tmp_path / "bad"
    shutil.copytree(sim_run, bad, ignore=shutil.ignore_patterns("run.lock"))
    counts = json.loads((bad / "counts.json").read_text())
    counts["committed"] += 1
    (bad / "counts.json").write_text(json.dumps(counts))
    found = checks.verify_violations(bad)
    assert found and found[0].invariant == "accounting" and "committed" in found[0].message


def test_capped_keeps_the_count() -> None:
    vs = [checks.Violation("x", str(i)) for i in range(25)]
    out = checks.capped(vs, 20)
    assert len(out) == 21 and out[-1].message == "... and 5 more x violation(s)"
