"""trainer.on_nonfinite: a non-finite step is never committed; skip discards its batch
(step_skipped, nonfinite_step), stop ends the run; repeated skips end it on the budget.

Before: the step was committed (NaN weights published), or the error escaped as an
ExceptionGroup with the ledger left open.
"""

from __future__ import annotations

from pathlib import Path

from pipeline_fakes import FakeLearner, Harness

from freshroll import events as ev
from freshroll.errors import FailureBudgetExceeded, NonFiniteStep


def _nonfinite_on(*calls: int):
    def behaviour(call: int) -> None:
        if call in calls:
            raise NonFiniteStep("loss is nan (rewards not finite in float32)")
    return behaviour


def test_skip_discards_the_batch_records_step_skipped_and_goes_on(tmp_path: Path):
    learner = FakeLearner(_nonfinite_on(2))
    h = Harness(tmp_path, learner=learner, overrides=["run.steps=3"])
    assert h.run() is None
    assert len(h.steps) == 3 and learner.applied == 3 and learner.calls == 4
    [skipped] = h.events(ev.StepSkipped)
    assert skipped.reason == "nonfinite" and skipped.detail.startswith("step 2: loss is nan")
    assert h.skips == [(2, "loss is nan (rewards not finite in float32)")]
    leased = {e.lease: e for e in h.events(ev.Leased)}
    released = [e for e in h.events(ev.LeaseReleased) if e.lease == skipped.lease]
    assert [e.reason for e in released] == ["step_skipped"]
    discarded = {d.sample for d in h.events(ev.Discarded) if d.reason == "nonfinite_step"}
    lease_groups = set(leased[skipped.lease].groups)
    ready = {s for e in h.events(ev.Ready) if e.group in lease_groups for s in e.samples}
    assert discarded == ready and discarded
    committed = {s for e in h.events(ev.Committed) for s in e.samples}
    assert not committed & discarded
    assert [e.parent.split("-")[0] for e in h.events(ev.Committed)] == ["p0", "p1", "p2"]
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()


def test_stop_raises_non_finite_step_and_closes_the_ledger(tmp_path: Path):
    h = Harness(tmp_path, learner=FakeLearner(_nonfinite_on(2)),
                overrides=["trainer.on_nonfinite=stop"])
    err = h.run()
    assert type(err) is NonFiniteStep
    assert str(err) == ("trainer step 2 (lease l1) is not finite: loss is nan (rewards not "
                        "finite in float32) (trainer.on_nonfinite: stop)")
    assert len(h.steps) == 1 and h.events(ev.StepSkipped) == []
    assert h.buf.closed and h.verify().ok


def test_repeated_skips_end_the_run_on_the_trainer_budget(tmp_path: Path):
    h = Harness(tmp_path, learner=FakeLearner(_nonfinite_on(*range(1, 100))),
                overrides=["limits.max_consecutive_skipped_steps=3"])
    err = h.run()
    assert type(err) is FailureBudgetExceeded
    assert str(err).startswith("trainer failed 3 steps in a row "
                               "(limits.max_consecutive_skipped_steps=3)")
    assert len(h.events(ev.StepSkipped)) == 3 and h.steps == []
    assert h.verify().ok
