"""Over-provisioned groups under the chaos library (issue 26, item 3): an interrupt and a
SIGKILL with over-provisioned groups in flight, resumed; every check of the library (verify's
invariants, the admission bound, ...) holds, and cancelled samples are never trained on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from freshroll.chaos import runner
from freshroll.chaos.plan import parse_plan
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import request_of
from freshroll.ledger.store import LEDGER_FILE, Ledger

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from child_support import INJECTOR, child_path  # noqa: E402, F401  (child_path: autouse)

PLAN = parse_plan({
    "workload": {"tail": {"overprovision": 2}},
    "scenarios": [
        {"name": "interrupt", "faults": [{"kind": "interrupt", "at": {"step": 5}}]},
        {"name": "kill", "faults": [{"kind": "kill_process", "at": {"step": 7}}]},
    ]}, "overprovision plan")


@pytest.mark.parametrize("name", ["interrupt", "kill"])
def test_over_provisioned_runs_survive_a_resume_with_every_check(tmp_path: Path,
                                                                 name: str) -> None:
    scen = next(s for s in PLAN.scenarios if s.name == name)
    r = runner.run_case(PLAN, scen, 0, tmp_path, injector=INJECTOR)
    assert r.ok, r.violations
    assert r.incarnations == 2 and r.outcome == "finished"
    with Ledger(r.run_dir / LEDGER_FILE, sync="off") as led:
        events = [e for _, e in led.events()]
    over = {e.group for e in events if isinstance(e, ev.Requested) and e.target is not None}
    assert over
    cancelled = {e.request for e in events
                 if isinstance(e, ev.Discarded) and e.reason == "cancelled"}
    committed = {request_of(s) for e in events if isinstance(e, ev.Committed)
                 for s in e.samples}
    assert cancelled and not cancelled & committed


def test_without_the_stop_at_target_the_library_finds_the_violation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The protection is load-bearing: with the stop at target monkeypatched away, every
    member of an over-provisioned group is trained on, and the case fails verify (a group
    ready past its target)."""
    from freshroll.kernel import stop_at_target

    monkeypatch.setattr(stop_at_target, "reached", lambda group: False)
    scen = next(s for s in PLAN.scenarios if s.name == "interrupt")
    r = runner.run_case(PLAN, scen, 0, tmp_path, injector=INJECTOR)
    assert not r.ok
    assert any("over its target 4" in str(v) for v in r.violations), r.violations[:3]
