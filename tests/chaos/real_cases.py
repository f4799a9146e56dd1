"""The shipped library's ``real: true`` scenarios, run once per placement for a test module
(tests/chaos/test_real.py: Ray; test_real_inline.py: inline), and ledger readers for them."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import yaml

from freshroll.chaos.plan import load_plan
from freshroll.chaos.result import CaseResult
from freshroll.chaos.runner import run_plan
from ray_owner import live_tokens_of, owned

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "chaos" / "library.yaml"


def run_real_cases(out: Path, placement: str) -> tuple[dict[str, CaseResult], str]:
    """Every real scenario of the library, seed 0, on ``placement``, through the chaos
    runner exactly as ``freshroll chaos --real`` runs them: ({scenario: result}, the runner's
    progress text). Fails if a Ray instance that the cases started is still alive."""
    plan = load_plan(LIBRARY)
    real = [s.name for s in plan.scenarios if s.real]
    assert {"worker-stall", "worker-kill", "process-killed"} <= set(real)
    progress = io.StringIO()
    with owned() as tag:
        results = run_plan(plan, [0], out, only=real, placements=(placement,),
                           progress=progress)
        assert live_tokens_of(tag) == set(), "a Ray instance of the cases is still alive"
    return {r.scenario: r for r in results}, progress.getvalue()


def _steps(run_dir: Path) -> int:
    """The run's own ``run.steps`` (its config.yaml)."""
    return int(yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["steps"])


def rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    try:
        return [tuple(r) for r in db.execute(sql)]
    finally:
        db.close()


def events(run_dir: Path, kind: str, *fields: str) -> list[tuple[object, ...]]:
    cols = ", ".join(f"json_extract(body, '$.{f}')" for f in fields)
    return rows(run_dir, f"SELECT {cols} FROM events WHERE kind = '{kind}' ORDER BY seq")


def check_finished_clean(ran: dict[str, CaseResult]) -> None:
    for name, r in ran.items():
        assert r.ok, f"{name}: {r.violations}"
        assert r.faults_injected == r.faults_planned
        assert r.outcome == "finished"


def check_killed_and_resumed(r: CaseResult) -> None:
    """A real SIGKILL of the run's child process, then a resume from the ledger and the
    real checkpoints."""
    run_dir = r.run_dir
    assert r.incarnations == 2
    logs = sorted(run_dir.parent.glob("child-*.log"))
    assert logs, "the kill incarnation did not run in a child process"
    assert not list(run_dir.parent.glob("child-1.result.json"))  # it never got to write one
    detail, = (d for (d,) in events(run_dir, "fault_injected", "detail"))
    assert "SIGKILL" in str(detail)
    opened = events(run_dir, "opened", "incarnation")
    assert [i for (i,) in opened] == [0, 1]
    assert list((run_dir / "checkpoints").glob("step-*"))  # real checkpoints were written
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == _steps(run_dir) == 5  # a kill at step 2, then 3 more


def check_replays(r: CaseResult) -> None:
    """``freshroll replay`` of a real run reproduces every committed digest from its initial
    model (issue 29, item 3): here a run SIGKILLed and resumed."""
    from freshroll.runtime.replay_run import replay_run

    result = replay_run(r.run_dir)
    assert result.ok, result.render()
    assert result.from_step == 0 and result.steps == result.to_step == _steps(r.run_dir)
