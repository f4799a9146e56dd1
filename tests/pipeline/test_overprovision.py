"""Over-provisioning in the pipeline (pipeline/overprovision.py): simulated engines in virtual
time on a long-tailed P2 (small shapes): extra requests admitted, the first ``group_size``
done kept, the rest cancelled on their engines, conservation under ``verify`` and the chaos
library's checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tailing import P2_LONG_TAIL, SimRun, committed_group_sizes

from freshroll.chaos.checks import admission_bound
from freshroll.config.run import TailSection
from freshroll.figures.bias import sample_bias
from freshroll.harness.verify import verify_ledger
from freshroll.ledger import events as ev
from freshroll.pipeline.overprovision import MIN_LATENCIES, Overprovision


@pytest.mark.parametrize("extra", [["tail.overprovision=2"],
                                   ["tail.overprovision=2", "tail.deadline=true"],
                                   ["tail.overprovision=auto", "tail.max_extra=3"]],
                         ids=["two", "two+deadline", "auto"])
def test_extras_are_cancelled_at_target_and_nothing_is_lost(tmp_path: Path,
                                                           extra: list[str]) -> None:
    run = SimRun(tmp_path, [*P2_LONG_TAIL, *extra])
    run.run()
    events = run.events()
    assert len(run.steps) == run.cfg.run.steps  # no hang
    report = verify_ledger(run.buf.ledger, dict(run.buf.counts))
    assert report.ok, report.render()
    assert admission_bound(events) == []
    g = run.cfg.rollout.group_size
    requested = [e for e in events if isinstance(e, ev.Requested)]
    over = [e for e in requested if e.target is not None]
    assert over and all(e.target == g and g < e.size <= g + 3 for e in over)
    cancelled = [e for e in events if isinstance(e, ev.Discarded) and e.reason == "cancelled"]
    assert cancelled and not any(e.reason == "stale" for e in cancelled)
    assert max(committed_group_sizes(events).values()) <= g  # never more than G trained
    # the engines dropped what the stop ended while it ran; their slots were reused
    engine_cancels = sum(e.counters()["cancelled"] for e in run.engines)
    assert engine_cancels > 0
    assert max(e.peak for e in run.engines) <= run.cfg.rollout.worker_batch
    assert run.pipe.overprov.admitted == sum(e.size - g for e in over)
    if "tail.deadline=true" not in extra:  # (deadline cuts cancel on the engines too)
        assert run.pipe.overprov.cancelled == engine_cancels  # the stops, every one
    bias = sample_bias(events)
    assert bias["generated"] > bias["accepted"]  # the cancelled count (censored lengths)


def test_auto_admits_extras_by_the_binomial_rule_once_measured() -> None:
    op = Overprovision(TailSection(overprovision="auto", max_extra=4), group_size=8)
    assert op.auto([1.0] * (MIN_LATENCIES - 1)) == 0  # not measured yet
    assert op.auto([1.0] * 20) == 0  # every request on time: no extra
    tail = [1.0] * 16 + [10.0] * 4  # 80% within 3 x p50
    assert op.auto(tail) == 4  # P[Bin(8+m, 0.8) >= 8] >= 0.95 needs more: capped at 4
    op.live = 9
    assert op.extra(NoLatencies()) == 4  # type: ignore[arg-type]  # the controller's, bounded
    op.live = 1
    assert op.extra(NoLatencies()) == 1  # type: ignore[arg-type]  # a fake buffer
    assert op.admitted == 5


class NoLatencies:
    def recent_latencies(self) -> list[float]:
        return []


def test_the_controller_moves_the_tail_levers_and_each_admission_follows_them(
        tmp_path: Path) -> None:
    """control.mode adaptive + tail.overprovision auto: the extras and deadlines are the
    controller's outputs (control/levers.py), each a controller_decided event with its inputs;
    every group is admitted with the extras of the decision in force."""
    run = SimRun(tmp_path, [*P2_LONG_TAIL, "control.mode=adaptive", "tail.overprovision=auto",
                            "tail.max_extra=3", "control.interval_s=2", "run.steps=16",
                            "control.max_concurrency=16"])  # the rig checks worker_batch slots
    run.run()
    events = run.events()
    assert verify_ledger(run.buf.ledger, dict(run.buf.counts)).ok
    decided = [e for e in events if isinstance(e, ev.ControllerDecided)]
    moved = [e for e in decided if e.settings.extra != e.previous.extra]
    assert moved and all(0 <= e.settings.extra <= 3 for e in decided)
    assert any(e.settings.deadline for e in decided)
    assert all("generated" in e.inputs and "fed_rate" in e.inputs for e in decided)
    extra = 0
    g = run.cfg.rollout.group_size
    for e in events:  # each admission carries the amount of the decision in force
        if isinstance(e, ev.ControllerDecided):
            extra = e.settings.extra
        elif isinstance(e, ev.Requested):
            assert e.size == g + extra
    tailing = run.pipe.tailing
    assert tailing is not None and tailing.watch.enabled  # turned on by the controller


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "lock-step"])
def test_stop_at_target_on_the_fake_engines_of_the_real_pipeline(tmp_path: Path,
                                                                 continuous: bool) -> None:
    """Engine-agnostic: the async fakes of the pipeline tests (a continuous engine that
    honours cancel, a lock-step one whose batch runs to its end and whose late results are
    rejected), in virtual time."""
    from async_fakes import AsyncHarness, Factory

    h = AsyncHarness(tmp_path, overrides=["tail.overprovision=2", "run.steps=6"],
                     factory=Factory(continuous=continuous))
    assert h.run() is None
    h.buf.shutdown("done")
    events = [e for _, e in h.buf.ledger.events()]
    assert verify_ledger(h.buf.ledger, dict(h.buf.counts)).ok
    over = [e for e in events if isinstance(e, ev.Requested)]
    assert over and all((e.size, e.target) == (6, 4) for e in over)
    assert max(committed_group_sizes(events).values()) <= 4
    cancelled = [e for e in events if isinstance(e, ev.Discarded) and e.reason == "cancelled"]
    assert cancelled
