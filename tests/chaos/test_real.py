"""The shipped library's ``real: true`` scenarios on the tiny real model on Ray (inline:
test_real_inline.py), one seed each, through the chaos runner exactly as
``freshroll chaos --real`` runs them: zero violations, every planned fault recorded, and
what makes each one real:

* ``kill_process``: the child process really died of SIGKILL and the run was resumed from
  its ledger and real checkpoints (the resume replays steps against their weights digests);
* ``kill_worker``: the actor was killed with ``ray.kill`` (the fault's record says so), its
  epoch fenced ``lost`` and a new epoch started for it;
* ``stall_worker``: the stuck call's epoch was fenced ``timeout`` after
  ``limits.generate_timeout_s`` of real time, and its late results were rejected (a stall's
  run has ONE worker and 8 steps, ``chaos.real.STALL_WORKLOAD``: it cannot finish before the
  replacement worker started, so the late results land while it runs; it had two workers and
  100 steps, twice with its twin: ~40 CPU-s of the module's, see CHANGELOG 2026-12-07);
* every Ray instance the cases started is gone when they end.

Slow: each run starts a Ray instance and two actors (tens of seconds on a loaded CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from real_cases import (
    check_finished_clean,
    check_killed_and_resumed,
    check_replays,
    events,
    run_real_cases,
)

from freshroll.chaos.result import CaseResult

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CaseResult]:
    found, _ = run_real_cases(tmp_path_factory.mktemp("real-chaos-ray"), "ray")
    return found


def test_every_real_case_has_zero_violations(cases: dict[str, CaseResult]):
    assert {"process-killed", "worker-kill", "worker-stall"} <= set(cases)
    check_finished_clean(cases)


def test_a_real_sigkill_then_a_resume_from_the_ledger_and_checkpoints(
        cases: dict[str, CaseResult]):
    check_killed_and_resumed(cases["process-killed"])


def test_the_ray_worker_kill_really_killed_an_actor(cases: dict[str, CaseResult]):
    run_dir: Path = cases["worker-kill"].run_dir
    (target, detail), = events(run_dir, "fault_injected", "target", "detail")
    assert "for real (KillableThreadEngine.kill())" in str(detail)
    fenced = events(run_dir, "worker_fenced", "worker", "epoch", "reason")
    assert (target, 0, "lost") in fenced
    started = events(run_dir, "worker_started", "worker", "epoch")
    assert (target, 1) in started  # a new epoch: a new actor was started for it


def test_the_ray_stall_is_fenced_and_its_late_results_rejected(cases: dict[str, CaseResult]):
    """The one worker's stalled epoch is fenced ``timeout``, a new actor started for it (the
    run needs it: no other worker), and the zombie's late results rejected ``fenced``."""
    run_dir: Path = cases["worker-stall"].run_dir
    (target,), = events(run_dir, "fault_injected", "target")
    assert (target, 0, "timeout") in events(run_dir, "worker_fenced", "worker", "epoch",
                                            "reason")
    assert {w for (w,) in events(run_dir, "worker_started", "worker")} == {target}
    assert (target, 1) in events(run_dir, "worker_started", "worker", "epoch")
    rejected = [s for (s, why) in events(run_dir, "rejected", "sample", "reason")
                if why == "fenced"]
    assert rejected, "the zombie's late results never reached the buffer"


def test_a_killed_and_resumed_run_replays_to_every_committed_digest(
        cases: dict[str, CaseResult]):
    check_replays(cases["process-killed"])
