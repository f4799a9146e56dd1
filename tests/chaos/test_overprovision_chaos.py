"""Over-provisioned groups under the chaos library (issue 26, item 3): an interrupt and a
SIGKILL with over-provisioned groups in flight, resumed; every check of the library (verify's
invariants, the admission bound, ...) holds, and cancelled samples are never trained on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from freshroll import events as ev
from freshroll.chaos import runner
from freshroll.chaos.plan import parse_plan
from freshroll.ledger import LEDGER_FILE, Ledger
from freshroll.lineage import request_of

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
try:
    import freshroll.chaos.inject  # noqa: F401

    INJECTOR = runner.INJECTOR
except ImportError:
    INJECTOR = "standin:Injector"

PLAN = parse_plan({
    "workload": {"tail": {"overprovision": 2}},
    "scenarios": [
        {"name": "interrupt", "faults": [{"kind": "interrupt", "at": {"step": 5}}]},
        {"name": "kill", "faults": [{"kind": "kill_process", "at": {"step": 7}}]},
    ]}, "overprovision plan")


@pytest.fixture(autouse=True)
def _child_path(monkeypatch: pytest.MonkeyPatch) -> None:
    src = str(Path(runner.__file__).parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, str(HERE),
                                                      os.environ.get("PYTHONPATH", "")]))


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
