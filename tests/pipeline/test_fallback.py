"""The sync fallback (:mod:`freshroll.pipeline.fallback`): the probe's state machine on a fake
clock, the buffer's look-ahead, the ledger fold and verdict it feeds, and one real run."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from freshroll.clock import VirtualClock
from freshroll.errors import StateError
from freshroll.figures.overlap import ModeFold, render
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ledger.store import Ledger
from freshroll.pipeline.fallback import EarlierChoice, FallbackConfig, FallbackProbe, Switch

ROLLOUTS = 16


def _drive(probe: FallbackProbe, step_s: dict[str, float], steps: int) -> list[Switch]:
    """Commit ``steps`` steps, each taking ``step_s[mode]`` seconds in the probe's mode."""
    t, out = 0.0, []
    for step in range(1, steps + 1):
        t += step_s[probe.mode]
        switch = probe.committed(step, t)
        if switch is not None:
            out.append(switch)
    return out


def _probe(**kw: float) -> FallbackProbe:
    return FallbackProbe(FallbackConfig(max_staleness=1, rollouts_per_step=ROLLOUTS,
                                        window_steps=4, window_s=0.0, warmup_steps=2, **kw))


def test_async_that_does_not_pay_falls_back_to_sync_with_both_rates_measured():
    probe = _probe(every_s=1e9)
    switches = _drive(probe, {"async": 0.10, "sync": 0.08}, 40)
    assert [(s.phase, s.mode, s.lookahead) for s in switches] == [
        ("probe", "sync", 0), ("chose", "sync", 0)]
    chose = switches[1]
    assert chose.async_per_s == pytest.approx(ROLLOUTS / 0.10)
    assert chose.sync_per_s == pytest.approx(ROLLOUTS / 0.08)
    assert "falling back to sync" in chose.reason
    assert probe.mode == "sync"


def test_async_that_pays_is_kept_and_probed_again_after_the_hold():
    probe = _probe(every_s=5.0, hold_factor=20.0)
    switches = _drive(probe, {"async": 0.05, "sync": 0.10}, 400)
    chose = [s for s in switches if s.phase == "chose"]
    assert all(s.mode == "async" for s in chose) and len(chose) >= 2
    assert chose[0].async_per_s == pytest.approx(2 * chose[0].sync_per_s)
    # a probe lasts ~ measure (4 x 0.05) + settle (2 x 0.1) + measure (4 x 0.1) = 0.8 s, so
    # the hold is max(every_s, 20 x 0.8 s) = 16 s: about 2 probes per 16 s of 0.05 s steps
    probes = [s for s in switches if s.phase == "probe"]
    assert all(s.mode == "sync" for s in probes)  # each probe measures async, then sync
    starts = [s.step for s in switches if s.phase == "probe" and s.mode == "sync"]
    assert len(starts) >= 2 and starts[1] - starts[0] >= 16.0 / 0.05 * 0.9


def _drive_kl(probe: FallbackProbe, step_s: dict[str, float], steps: int,
              kl: dict[str, float]) -> list[Switch]:
    """``_drive`` with each step's trainer metrics: a stale step (lag 1) with ``kl[mode]``."""
    t, out = 0.0, []
    for step in range(1, steps + 1):
        t += step_s[probe.mode]
        lag = 1.0 if probe.mode == "async" else 0.0
        switch = probe.committed(step, t, {"lag_mean": lag, "mismatch_kl": kl[probe.mode]})
        if switch is not None:
            out.append(switch)
    return out


def test_async_that_pays_but_costs_learning_falls_back_to_sync():
    """The probe chooses sync when the async window's stale steps moved the policy past
    ``kl_risk``, however much faster async runs; the reason names the figure."""
    probe = _probe(every_s=1e9, kl_risk=0.04)
    switches = _drive_kl(probe, {"async": 0.05, "sync": 0.10}, 40, {"async": 0.06, "sync": 0.0})
    chose = [s for s in switches if s.phase == "chose"]
    assert [s.mode for s in chose] == ["sync"] and probe.mode == "sync"
    assert chose[0].reason.startswith("learning: async 2.00x the sync window pays, but the "
                                      "last 4 stale steps' mismatch KL 0.0600 is above 0.04")
    # the next run of the same work starts from the speed answer, not this run's late KL
    assert probe.last_choice is not None and probe.last_choice.mode == "async"
    calm = _probe(every_s=1e9, kl_risk=0.04)  # the same rates under the bound: async kept
    kept = _drive_kl(calm, {"async": 0.05, "sync": 0.10}, 40, {"async": 0.02, "sync": 0.0})
    assert [s.mode for s in kept if s.phase == "chose"] == ["async"]
    off = _probe(every_s=1e9)  # kl_risk None: rates alone decide
    assert [s.mode for s in _drive_kl(off, {"async": 0.05, "sync": 0.10}, 40,
                                      {"async": 0.5, "sync": 0.0}) if s.phase == "chose"] == [
        "async"]


def test_async_held_falls_back_at_once_when_its_stale_steps_go_past_the_risk():
    """Held in async after a probe, a window of stale steps above ``kl_risk`` switches to sync
    at once, held until the next probe ``every_s`` later, which judges async afresh."""
    probe = _probe(every_s=2.0, hold_factor=0.0, kl_risk=0.04)
    t, switches = 0.0, []
    for step in range(1, 200):
        t += 0.05 if probe.mode == "async" else 0.10
        kl = 0.01 if step < 30 else 0.09  # the policy starts moving fast at step 30
        lag = 1.0 if probe.mode == "async" else 0.0
        s = probe.committed(step, t, {"lag_mean": lag, "mismatch_kl": kl})
        if s is not None:
            switches.append(s)
    learned = [s for s in switches if s.reason.startswith("learning:")]
    assert learned and learned[0].mode == "sync" and learned[0].lookahead == 0
    assert 30 <= learned[0].step <= 34  # a full window of 4 risky stale steps
    after = [s for s in switches if s.step > learned[0].step]
    assert after and after[0].phase == "probe"  # the next probe, every_s later
    assert all(s.mode == "sync" for s in switches if s.phase == "chose" and s.step > 34)
    # kept for the next run: the last probe's speed answer (async pays 2x), not the fallback
    assert probe.last_choice is not None and probe.last_choice.mode == "async"


def test_fallback_kl_risk_is_the_runs_own_at_risk_bound():
    from freshroll.config import Config
    from freshroll.figures.learning import KL_RISK
    from freshroll.pipeline.fallback import probe_for

    cfg = Config.model_validate({"run": {"max_staleness": 1}})
    assert cfg.control.fallback_kl_risk == KL_RISK
    probe = probe_for(cfg)
    assert probe is not None and probe.config.kl_risk == KL_RISK
    off = probe_for(Config.model_validate({"run": {"max_staleness": 1},
                                           "control": {"fallback_kl_risk": None}}))
    assert off is not None and off.config.kl_risk is None
    with pytest.raises(ValueError, match="kl_risk"):
        FallbackConfig(max_staleness=1, rollouts_per_step=4, kl_risk=0.0)


def test_a_learning_fallback_is_listed_apart_from_the_rate_probes_and_said():
    fold = ModeFold()
    fold.commits = 12
    fold.decided(_decided(12, "sync", "probe", 100.0, None))  # type: ignore[arg-type]
    fold.commits = 20
    fold.decided(_decided(20, "async", "chose", 200.0, 100.0))  # type: ignore[arg-type]
    fold.commits = 31
    fold.decided(ev.ModeDecided(ts=0.0, step=31, mode="sync", phase="chose", lookahead=0,
                                reason="learning: the last 8 stale steps' mismatch KL 0.0700 "
                                "is above 0.04", async_per_s=200.0, sync_per_s=100.0))
    fold.commits = 40
    r = fold.result()
    assert r is not None and len(r["probes"]) == 1 and r["mode"] == "sync"
    assert r["learning"] == [{"step": 31, "reason": "learning: the last 8 stale steps' "
                              "mismatch KL 0.0700 is above 0.04"}]
    line = render({"verdict": "paid", "verdict_source": "measured", "overlapped": 0.5,
                   "parallelism": 1.5, "fallback": r, "accepted_rollouts_per_s": 2.0,
                   "sync_estimate_per_s": 1.0, "ratio": 2.0})
    assert line.startswith("asynchrony paid") and line.endswith(
        "fell back to sync 1 time(s) for learning, last at step 31 (the last 8 stale steps' "
        "mismatch KL 0.0700 is above 0.04)")


def test_an_earlier_runs_choice_is_held_from_the_start_then_probed_afresh():
    probe = _probe(every_s=2.0, hold_factor=0.0)
    start = probe.reuse(EarlierChoice("sync", 100.0, 150.0, 1_000_000.0), step=3)
    assert (start.step, start.phase, start.mode, start.lookahead) == (3, "chose", "sync", 0)
    assert "reused" in start.reason and "0.67x" in start.reason
    assert (start.async_per_s, start.sync_per_s) == (100.0, 150.0)
    assert probe.last_choice is None  # nothing measured by this run yet
    # no warm-up, no probe: sync held for every_s after the first commit ...
    switches = _drive(probe, {"async": 0.05, "sync": 0.10}, 19)
    assert switches == [] and probe.mode == "sync"
    # ... then a probe measures afresh (async pays here) and that choice is this run's
    switches = _drive(probe, {"async": 0.05, "sync": 0.10}, 40)
    assert [s.phase for s in switches][:2] == ["probe", "chose"]
    assert probe.mode == "async" and probe.last_choice is not None
    assert probe.last_choice.mode == "async"
    assert probe.last_choice.async_per_s == pytest.approx(2 * probe.last_choice.sync_per_s)
    late = _probe()
    late.committed(1, 0.1)
    with pytest.raises(ValueError, match="before the first commit"):
        late.reuse(EarlierChoice("sync", 1.0, 1.0, 0.0))


def test_a_start_in_sync_for_a_reason_holds_then_measures_both_modes(
        capsys: pytest.CaptureFixture[str]):
    probe = _probe(every_s=2.0, hold_factor=0.0)
    start = probe.reuse(EarlierChoice("sync", None, None, 0.0, "the thread probe: threads pay"))
    assert start.mode == "sync" and start.reason.startswith("the thread probe: threads pay")
    assert start.start  # the mode the run starts in: no stderr line of its own
    from freshroll.pipeline.observers import Notes

    Notes().on_mode(start)
    assert capsys.readouterr().err == ""
    assert (start.async_per_s, start.sync_per_s) == (None, None)
    assert _drive(probe, {"async": 0.05, "sync": 0.10}, 19) == []  # held every_s
    switches = _drive(probe, {"async": 0.05, "sync": 0.10}, 40)
    chose = [s for s in switches if s.phase == "chose"]
    assert chose and chose[0].mode == "async" and chose[0].sync_per_s and chose[0].async_per_s
    Notes().on_mode(chose[0])  # a choice made during the run: one line
    assert capsys.readouterr().err.startswith("sync fallback (step ")


def test_a_start_that_is_an_estimate_is_probed_right_after_the_warm_up():
    # Ray's actors started in sync on the thread probe's reading: checked at once, not held
    probe = _probe(every_s=1e9, hold_factor=0.0)
    start = probe.reuse(EarlierChoice("sync", None, None, 0.0, "the thread probe: threads pay",
                                      hold=False))
    assert start.mode == "sync" and start.start and "until the first probe" in start.reason
    switches = _drive(probe, {"async": 0.05, "sync": 0.10}, 40)  # held: none in 1e9 s
    chose = [s for s in switches if s.phase == "chose"]
    assert switches and switches[0].phase == "probe" and switches[0].mode == "async"
    assert chose and chose[0].mode == "async" and chose[0].sync_per_s is not None
    held = _probe(every_s=1e9, hold_factor=0.0)
    held.reuse(EarlierChoice("sync", None, None, 0.0, "the thread probe: threads pay"))
    assert _drive(held, {"async": 0.05, "sync": 0.10}, 40) == []


def test_a_tie_goes_to_sync_and_a_margin_is_needed_for_async():
    assert _drive(_probe(every_s=1e9), {"async": 0.1, "sync": 0.1}, 40)[-1].mode == "sync"
    within = _drive(_probe(every_s=1e9, margin=0.05), {"async": 0.097, "sync": 0.1}, 40)
    assert within[-1].mode == "sync"  # 1.03x < 1.05x
    beyond = _drive(_probe(every_s=1e9, margin=0.05), {"async": 0.09, "sync": 0.1}, 40)
    assert beyond[-1].mode == "async"  # 1.11x


def test_from_sync_a_probe_measures_sync_first_then_async():
    probe = _probe(every_s=1.0, hold_factor=0.0)
    switches = _drive(probe, {"async": 0.2, "sync": 0.1}, 200)
    phases = [(s.phase, s.mode) for s in switches[:4]]
    assert phases == [("probe", "sync"), ("chose", "sync"), ("probe", "async"), ("chose", "sync")]


def test_windows_need_both_their_steps_and_their_seconds():
    probe = FallbackProbe(FallbackConfig(max_staleness=2, rollouts_per_step=1, window_steps=2,
                                         window_s=1.0, warmup_steps=0, every_s=1e9))
    switches = _drive(probe, {"async": 0.1, "sync": 0.1}, 60)
    first = switches[0]
    assert first.phase == "probe" and first.step >= 11  # 1 s of 0.1 s steps, not 2 steps
    # going to sync, the batches generated ahead are drained first: max_staleness + 1 steps
    assert switches[1].step - first.step >= 3 + 10


def test_config_rejects_a_sync_run_and_bad_windows():
    with pytest.raises(ValueError, match="max_staleness"):
        FallbackConfig(max_staleness=0, rollouts_per_step=1)
    with pytest.raises(ValueError, match="window_steps"):
        FallbackConfig(max_staleness=1, rollouts_per_step=1, window_steps=0)
    with pytest.raises(ValueError, match="every_s"):
        FallbackConfig(max_staleness=1, rollouts_per_step=1, every_s=0)


def test_probe_for_follows_control_fallback():
    from freshroll.config import load_config
    from freshroll.pipeline.fallback import probe_for

    assert probe_for(load_config(None, [])) is not None  # async hf: auto is on
    assert probe_for(load_config(None, ["run.max_staleness=0"])) is None
    assert probe_for(load_config(None, ["control.fallback=false"])) is None
    with pytest.raises(Exception, match="fallback"):
        load_config(None, ["control.fallback=maybe"])


def test_buffer_lookahead_zero_admits_like_a_sync_run(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    buf = SampleBuffer.open(ledger, KernelConfig(max_staleness=2, batch_groups=3, group_size=2),
                            VirtualClock(), run_id="run",
                            initial_version=PolicyVersion.initial("ab12"))
    assert buf.lookahead == 2 and buf.capacity() == 9  # (2 + 0 + 1) x 3
    buf.lookahead = 0
    assert buf.capacity() == 3  # one batch: the current policy's only
    for bad in (3, -1):
        with pytest.raises(StateError, match="lookahead"):
            buf.lookahead = bad
    ledger.close()


def _decided(step: int, mode: str, phase: str, a: float | None, s: float | None) -> ev.Event:
    return ev.ModeDecided(ts=float(step), step=step, mode=mode, phase=phase, reason="",
                          lookahead=1 if mode == "async" else 0, async_per_s=a, sync_per_s=s)


def test_mode_fold_counts_steps_per_mode_and_resume_restarts_async():
    fold = ModeFold()
    assert fold.result() is None
    fold.commits = 10
    fold.decided(_decided(10, "sync", "probe", 100.0, None))  # type: ignore[arg-type]
    fold.commits = 20
    fold.decided(_decided(20, "sync", "chose", 100.0, 125.0))  # type: ignore[arg-type]
    fold.commits = 30
    fold.opened()  # a resume: async again
    fold.commits = 35
    r = fold.result()
    assert r is not None
    assert r["steps"] == {"async": 15, "sync": 20}
    assert r["probes"][0]["ratio"] == pytest.approx(0.8) and r["probes"][0]["chose"] == "sync"
    # the first segment's choice says nothing of the async steps since the resume (issue 28
    # defect 6: the end line repeated it); a probe after the resume chooses again
    assert r["mode"] is None
    fold.decided(_decided(40, "async", "chose", 130.0, 100.0))  # type: ignore[arg-type]
    assert fold.result()["mode"] == "async"  # type: ignore[index]


def test_a_start_without_rates_is_no_measurement_and_the_end_line_says_why():
    fold = ModeFold()
    fold.decided(ev.ModeDecided(ts=0.0, step=0, mode="sync", phase="chose", lookahead=0,
                                reason="the thread probe: threads pay", async_per_s=None,
                                sync_per_s=None))
    fold.commits = 11
    r = fold.result()
    assert r is not None and r["probes"] == [] and r["mode"] is None
    assert r["steps"] == {"async": 0, "sync": 11} and r["started"]
    line = render({"verdict": "did not pay", "verdict_source": "estimated", "overlapped": 0.0,
                   "parallelism": 0.8, "fallback": r, "accepted_rollouts_per_s": 1.0,
                   "sync_estimate_per_s": 1.0, "ratio": 1.0})
    assert line.startswith("the run started in sync mode (the thread probe: threads pay)")
    assert "0/11 steps" in line


def test_measured_verdict_overrides_the_estimate_in_the_summary_and_its_line():
    from tests.runtime.test_overlap import B, _ledger

    n = 10
    calls = [(float(k), k + 1.0) for k in range(n)]  # a real overlap: the estimate says paid
    trains = [(k + 1.0, k + 2.0) for k in range(n)]
    events = _ledger(calls, trains)
    closed = events.pop()
    events.append(_decided(4, "sync", "probe", 2.0 * B, None))
    events.append(_decided(8, "sync", "chose", 2.0 * B, 2.2 * B))
    events.append(closed)
    from freshroll.figures.summary import fold_events

    o = fold_events(events).summary()["overlap"]
    assert o["verdict"] == "did not pay" and o["verdict_source"] == "measured"
    assert o["fallback"]["mode"] == "sync"
    line = render(o)
    assert line.startswith("asynchrony did not pay in this run: async windows 0.91x the sync")
    assert "the sync fallback kept the faster mode" in line


@pytest.mark.slow
def test_a_real_run_probes_records_each_switch_and_verifies(tmp_path: Path):
    """The real tiny default with short probe windows: the ledger holds the probe's switches
    (both rates measured), the summary reads them, the staleness bound held, verify passes."""
    from freshroll.config import load_config
    from freshroll.harness.verify import verify_run
    from freshroll.runtime.run import run

    cfg = load_config(None, [
        "run.steps=40", "run.progress=false", "task.n_prompts=256", "control.fallback=true",
        "control.fallback_window_steps=4", "control.fallback_window_s=0",
        "control.fallback_every_s=0.001",
    ])
    err = io.StringIO()
    result = run(cfg, tmp_path / "r", stream=err, report=False)
    assert result.ok
    ledger = Ledger(tmp_path / "r" / "ledger.sqlite", readonly=True)
    decided = [e for _, e in ledger.events() if isinstance(e, ev.ModeDecided)]
    ledger.close()
    assert decided and decided[0].phase == "probe" and decided[0].async_per_s
    chose = [e for e in decided if e.phase == "chose"]
    assert chose and all(e.async_per_s and e.sync_per_s for e in chose)
    o = json.loads((tmp_path / "r" / "summary.json").read_text())["overlap"]
    assert o["verdict_source"] == "measured"
    assert sum(o["fallback"]["steps"].values()) == 40
    report = verify_run(tmp_path / "r")
    assert report.ok, report.render()


def test_the_next_run_of_the_same_work_starts_in_the_choice_the_first_one_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With the probe cache on, the fallback's last choice is kept at a run's end; the next
    run of the same work at the same load starts in it (a ``mode_decided`` at step 0 that
    says "reused"), with no warm-up and no probe until ``every_s`` has passed."""
    from freshroll.config import load_config
    from freshroll.harness.verify import verify_run
    from freshroll.placement import probe_cache
    from freshroll.runtime.run import run

    monkeypatch.setattr(probe_cache.BusyMeter, "stop", lambda self: 0.25)  # a like load
    monkeypatch.setenv("FRESHROLL_PROBE_CACHE", "on")
    monkeypatch.setenv("FRESHROLL_CACHE_DIR", str(tmp_path / "cache"))
    # one intra-op thread: no thread probe, whose verdict under load (threads pay: a sync
    # start, a mode_decided of its own) would vary from run to run
    args = ["run.progress=false", "task.n_prompts=256", "run.runtime=inline",
            "run.torch_threads=1", "control.fallback=true", "control.fallback_window_steps=3",
            "control.fallback_window_s=0"]

    def decided(name: str, steps: int, *more: str) -> list[ev.ModeDecided]:
        cfg = load_config(None, [*args, f"run.steps={steps}", *more])
        assert run(cfg, tmp_path / name, stream=io.StringIO(), report=False).ok
        with Ledger(tmp_path / name / "ledger.sqlite", readonly=True) as ledger:
            return [e for _, e in ledger.events() if isinstance(e, ev.ModeDecided)]

    first = decided("a", 16, "control.fallback_every_s=1000")
    chose = [e for e in first if e.phase == "chose"]
    assert chose and not chose[-1].reason.startswith("reused")
    again = decided("b", 6, "run.seed=1", "control.fallback_every_s=1000")
    assert len(again) == 1, again  # the reused choice only: no probe in a 1000 s hold
    (start,) = again
    assert start.phase == "chose" and "reused" in start.reason and start.step == 0
    assert (start.mode, start.async_per_s, start.sync_per_s) == (
        chose[-1].mode, chose[-1].async_per_s, chose[-1].sync_per_s)
    assert verify_run(tmp_path / "b").ok
    o = json.loads((tmp_path / "b" / "summary.json").read_text())["overlap"]
    assert o["fallback"]["steps"].get(start.mode) == 6  # every step in the reused mode
    assert o["fallback"]["probes"][-1]["reused"] is True
    from freshroll.figures.overlap import render
    assert "measured by an earlier run of the same work at a like load" in render(o)
