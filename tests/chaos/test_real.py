"""The shipped library's ``real: true`` scenarios on the tiny real model, inline and on Ray.

One seed each, through the chaos runner exactly as ``freshroll chaos --real`` runs them: zero
violations, every planned fault recorded, and what makes each one real:

* ``kill_process``: the child process really died of SIGKILL and the run was resumed from
  its ledger and real checkpoints (the resume replays steps against their weights digests);
* ``kill_worker`` on Ray: the actor was killed with ``ray.kill`` (the fault's record says
  so), its epoch fenced ``lost`` and a new epoch started for it;
* ``stall_worker`` on Ray: the stuck call's epoch was fenced ``timeout`` after
  ``limits.generate_timeout_s`` of real time, and its late results were rejected;
* on ``inline``, faults that need a restarted engine are skipped with the reason
  (chaos/real.py; test_real_kill.py shows the stop they would cause);
* every Ray instance the cases started is gone when they end.

Slow: each Ray run starts a Ray instance and two actors (tens of seconds on a loaded CPU).
"""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest

from freshroll.chaos.plan import load_plan
from freshroll.chaos.real import REAL_WORKLOAD
from freshroll.chaos.runner import run_plan
from freshroll.runtime.ray_reaper import live_tokens

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "chaos" / "library.yaml"

pytestmark = [pytest.mark.slow, pytest.mark.ray]




def _rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    try:
        return [tuple(r) for r in db.execute(sql)]
    finally:
        db.close()


def _events(run_dir: Path, kind: str, *fields: str) -> list[tuple[object, ...]]:
    cols = ", ".join(f"json_extract(body, '$.{f}')" for f in fields)
    return _rows(run_dir, f"SELECT {cols} FROM events WHERE kind = '{kind}' ORDER BY seq")


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], object]:
    plan = load_plan(LIBRARY)
    real = [s.name for s in plan.scenarios if s.real]
    assert {"worker-stall", "worker-kill", "process-killed"} <= set(real)
    before = live_tokens()
    progress = io.StringIO()
    out = tmp_path_factory.mktemp("real-chaos")
    results = run_plan(plan, [0], out, only=real, placements=("inline", "ray"),
                       progress=progress)
    assert live_tokens() <= before, "a Ray instance of the cases is still alive"
    found: dict[tuple[str, str], object] = {(r.scenario, r.placement): r for r in results}
    found["progress"] = progress.getvalue()
    return found


def test_every_real_case_has_zero_violations(cases: dict[tuple[str, str], object]):
    ran = {k: r for k, r in cases.items() if k != "progress"}
    assert ("process-killed", "inline") in ran and ("process-killed", "ray") in ran
    assert ("worker-kill", "ray") in ran and ("worker-stall", "ray") in ran
    for (name, placement), r in ran.items():
        assert r.ok, f"{name} [{placement}]: {r.violations}"  # type: ignore[attr-defined]
        assert r.faults_injected == r.faults_planned  # type: ignore[attr-defined]
        assert r.outcome == "finished"  # type: ignore[attr-defined]


def test_inline_skips_the_faults_that_need_a_restarted_engine(
        cases: dict[tuple[str, str], object]):
    assert ("worker-kill", "inline") not in cases and ("worker-stall", "inline") not in cases
    progress = str(cases["progress"])
    for name in ("worker-kill", "worker-stall"):
        assert f"chaos {name} [inline]: skipped: " in progress
        assert "cannot be restarted" in progress


@pytest.mark.parametrize("placement", ["inline", "ray"])
def test_a_real_sigkill_then_a_resume_from_the_ledger_and_checkpoints(
        cases: dict[tuple[str, str], object], placement: str):
    r = cases[("process-killed", placement)]
    run_dir: Path = r.run_dir  # type: ignore[attr-defined]
    assert r.incarnations == 2  # type: ignore[attr-defined]
    logs = sorted(run_dir.parent.glob("child-*.log"))
    assert logs, "the kill incarnation did not run in a child process"
    assert not list(run_dir.parent.glob("child-1.result.json"))  # it never got to write one
    detail, = (d for (d,) in _events(run_dir, "fault_injected", "detail"))
    assert "SIGKILL" in str(detail)
    opened = _events(run_dir, "opened", "incarnation")
    assert [i for (i,) in opened] == [0, 1]
    assert list((run_dir / "checkpoints").glob("step-*"))  # real checkpoints were written
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == REAL_WORKLOAD["run"]["steps"]


def test_the_ray_worker_kill_really_killed_an_actor(cases: dict[tuple[str, str], object]):
    r = cases[("worker-kill", "ray")]
    run_dir: Path = r.run_dir  # type: ignore[attr-defined]
    (target, detail), = _events(run_dir, "fault_injected", "target", "detail")
    assert "for real (KillableThreadEngine.kill())" in str(detail)
    fenced = _events(run_dir, "worker_fenced", "worker", "epoch", "reason")
    assert (target, 0, "lost") in fenced
    started = _events(run_dir, "worker_started", "worker", "epoch")
    assert (target, 1) in started  # a new epoch: a new actor was started for it


def test_the_ray_stall_is_fenced_and_its_late_results_rejected(
        cases: dict[tuple[str, str], object]):
    r = cases[("worker-stall", "ray")]
    run_dir: Path = r.run_dir  # type: ignore[attr-defined]
    (target,), = _events(run_dir, "fault_injected", "target")
    assert (target, 0, "timeout") in _events(run_dir, "worker_fenced", "worker", "epoch",
                                             "reason")
    rejected = [s for (s, why) in _events(run_dir, "rejected", "sample", "reason")
                if why == "fenced"]
    assert rejected, "the zombie's late results never reached the buffer"
