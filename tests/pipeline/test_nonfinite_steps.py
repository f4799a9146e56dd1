"""trainer.on_nonfinite: a non-finite step is never committed; skip discards its batch
(step_skipped, nonfinite_step), stop ends the run; repeated skips end it on the budget.

Before: the step was committed (NaN weights published), or the error escaped as an
ExceptionGroup with the ledger left open.
"""

from __future__ import annotations

from pathlib import Path

from freshroll.errors import FailureBudgetExceeded, NonFiniteStep
from freshroll.ledger import events as ev
from pipeline_fakes import FakeLearner, Harness, fill_ready


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


# -- the kernel command: skip_step, and every crash prefix of it ---------------------------


def _history_with_a_skipped_step(path: Path) -> list[ev.Event]:
    from freshroll.clock import VirtualClock
    from freshroll.kernel.buffer import SampleBuffer
    from freshroll.kernel.results import KernelConfig
    from freshroll.ledger.lineage import PolicyVersion
    from freshroll.ledger.store import Ledger

    buf = SampleBuffer.open(Ledger(path, sync="off"), KernelConfig(1, 2, 2), VirtualClock(),
                            run_id="t", initial_version=PolicyVersion.initial("m"))
    fill_ready(buf)
    lease = buf.lease()
    assert lease is not None
    buf.skip_step(lease.id, "step 1: loss is nan")
    assert buf.version is not None and buf.version.step == 0
    assert buf.counts["discarded_nonfinite_step"] == len(lease.samples) == 4
    again = buf.lease()
    assert again is not None and not set(again.samples) & set(lease.samples)
    buf.commit(again.id, "s")
    buf.shutdown("done")
    return [e for _, e in buf.ledger.events()]


def test_skip_step_survives_a_crash_at_every_point(tmp_path: Path):
    from freshroll.clock import VirtualClock
    from freshroll.harness.verify import verify_ledger
    from freshroll.kernel.buffer import SampleBuffer
    from freshroll.kernel.results import KernelConfig
    from freshroll.ledger.lineage import PolicyVersion
    from freshroll.ledger.store import Ledger

    history = _history_with_a_skipped_step(tmp_path / "full.sqlite")
    for k in range(1, len(history) + 1):
        path = tmp_path / f"prefix{k}.sqlite"
        with Ledger(path, sync="off") as ledger:
            for e in history[:k]:
                ledger.append(e)
        buf = SampleBuffer.open(Ledger(path, sync="off"), KernelConfig(1, 2, 2), VirtualClock(),
                                run_id="t", initial_version=PolicyVersion.initial("m"))
        skipped = {e.sample for e in history[:k]
                   if isinstance(e, ev.Discarded) and e.reason == "nonfinite_step"}
        while (lease := buf.lease(1)) is not None:
            assert not set(lease.samples) & skipped, k  # a skipped sample is never trained on
            buf.commit(lease.id, "s")
        buf.shutdown("drained")
        report = verify_ledger(buf.ledger, counts=dict(buf.counts))
        assert report.ok, (k, report.render())
