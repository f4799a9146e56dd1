"""Refreshed members under the chaos library (``tail.refresh``, issue 26): an interrupt and a
SIGKILL while stale finished members are being re-issued, resumed; every check of the library
(verify's invariants: a refresh only of a member past the bound, never trained on; the
admission bound, ...) holds, and every request reaches one outcome."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from freshroll.chaos import runner
from freshroll.chaos.plan import parse_plan
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from child_support import INJECTOR, child_path  # noqa: E402, F401  (child_path: autouse)

PLAN = parse_plan({
    "workload": {"run": {"max_staleness": 1, "staleness_basis": "newest_token"},
                 "rollout": {"on_update": "continue"}, "sim": {"profile": "P2"},
                 "limits": {"generate_timeout_s": 3600.0}, "tail": {"refresh": True}},
    "scenarios": [
        {"name": "interrupt", "faults": [{"kind": "interrupt", "at": {"step": 5}}]},
        {"name": "kill", "faults": [{"kind": "kill_process", "at": {"step": 7}}]},
    ]}, "refresh plan")


@pytest.mark.parametrize("name", ["interrupt", "kill"])
def test_refreshing_runs_survive_a_resume_with_every_check(tmp_path: Path, name: str) -> None:
    scen = next(s for s in PLAN.scenarios if s.name == name)
    r = runner.run_case(PLAN, scen, 0, tmp_path, injector=INJECTOR)
    assert r.ok, r.violations
    assert r.incarnations == 2 and r.outcome == "finished"
    with Ledger(r.run_dir / LEDGER_FILE, sync="off") as led:
        events = [e for _, e in led.events()]
    refreshed = {e.sample for e in events
                 if isinstance(e, ev.Discarded) and e.reason == "refreshed"}
    committed = {s for e in events if isinstance(e, ev.Committed) for s in e.samples}
    assert refreshed and not refreshed & committed
    opened = [e for e in events if isinstance(e, ev.Opened)]
    after = min(i for i, e in enumerate(events) if isinstance(e, ev.Opened) and e.incarnation)
    assert len(opened) == 2 and any(isinstance(e, ev.Discarded) and e.reason == "refreshed"
                                    for e in events[after:])  # refreshing went on after it
