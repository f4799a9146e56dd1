"""The shipped library's ``real: true`` scenarios on the tiny real model, inline (Ray:
test_real.py), one seed each, through the chaos runner exactly as ``freshroll chaos --real``
runs them:

* ``kill_process``: the child process really died of SIGKILL and the run was resumed from
  its ledger and real checkpoints;
* the faults that need a restarted engine are skipped with the reason (chaos/real.py;
  test_real_kill.py shows the stop they would cause).
"""

from __future__ import annotations

import pytest
from real_cases import check_finished_clean, check_killed_and_resumed, check_replays, run_real_cases

from freshroll.chaos.result import CaseResult

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, CaseResult], str]:
    return run_real_cases(tmp_path_factory.mktemp("real-chaos-inline"), "inline")


def test_every_real_case_that_applies_has_zero_violations(
        cases: tuple[dict[str, CaseResult], str]):
    ran, _ = cases
    assert "process-killed" in ran
    check_finished_clean(ran)


def test_inline_skips_the_faults_that_need_a_restarted_engine(
        cases: tuple[dict[str, CaseResult], str]):
    ran, progress = cases
    assert "worker-kill" not in ran and "worker-stall" not in ran
    for name in ("worker-kill", "worker-stall"):
        assert f"chaos {name} [inline]: skipped: " in progress
        assert "cannot be restarted" in progress


def test_a_real_sigkill_then_a_resume_from_the_ledger_and_checkpoints(
        cases: tuple[dict[str, CaseResult], str]):
    check_killed_and_resumed(cases[0]["process-killed"])


def test_a_killed_and_resumed_run_replays_to_every_committed_digest(
        cases: tuple[dict[str, CaseResult], str]):
    check_replays(cases[0]["process-killed"])
