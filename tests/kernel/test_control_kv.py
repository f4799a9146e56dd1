"""The controller's engine rules (the memory knee), pure: preemptions in a window cut
concurrency like the hard cut, KV usage at kv_high or sequences waiting inside the engines
refuse an increase; the reason names the signals; the record round-trips; a snapshot without
an engine report decides exactly as before."""

from __future__ import annotations

import json
from dataclasses import replace

import msgspec
import pytest

from freshroll.control.controller import (
    ControlConfig,
    ControllerState,
    Settings,
    Snapshot,
    StaticController,
    decide,
)
from freshroll.errors import ConfigError
from freshroll.ledger import events as ev

W = 10.0


def cfg(**kw: float) -> ControlConfig:
    base: dict[str, float] = {"group_size": 4, "min_workers": 2, "max_workers": 2,
                              "max_concurrency": 64}
    base.update(kw)
    return ControlConfig(**base)  # type: ignore[arg-type]


def starving(c: int = 8, **engine: object) -> Snapshot:
    """Producer-bound (the trainer waits half the window on samples), 2 workers with every
    slot full and a turned-over pool: without an engine signal, concurrency goes up."""
    settings = Settings(admission_limit=0, concurrency=c, workers=2)
    return Snapshot(now=W, window_s=W, settings=settings, consumed_samples=50,
                    trainer_wait_s=5.0, waited_samples=20, worker_rates=(5.0, 5.0),
                    completed=1000, in_flight=2 * c, max_staleness=2, batch_groups=8,
                    **engine)  # type: ignore[arg-type]


def test_without_an_engine_report_the_increase_is_unchanged():
    d = decide(starving(), ControllerState(), cfg())
    assert d.settings.concurrency == 9 and "slots full" in d.reason
    assert "kv" not in d.reason and d.inputs.kv_cache_usage is None  # the HF engine's case


def test_preemptions_cut_like_the_hard_cut_whatever_the_bottleneck():
    config = cfg()
    d = decide(starving(8, kv_cache_usage=0.99, preemptions=3, engine_running=16),
               ControllerState(), config)
    assert d.bottleneck == "producer"  # a stale discard here would cut nothing
    assert d.settings.concurrency == 4  # floor(8 x hard_factor 0.5)
    assert d.state.ceiling == 7 and d.state.latched  # 16 in flight > 2 x 4
    assert "memory cut 8->4: 3 preemptions, kv cache 99.0%" in d.reason
    assert "3 preempted" in d.reason  # the head names the engine signals too


def test_preemption_cut_respects_min_concurrency_and_needs_no_turnover():
    d = decide(replace(starving(3, kv_cache_usage=0.5, preemptions=1), completed=0),
               ControllerState(), cfg(min_concurrency=2))
    assert d.settings.concurrency == 2 and "memory cut" in d.reason


def test_a_latched_cut_is_not_cut_again_by_the_preemptions_of_the_old_load():
    config = cfg()
    cut = decide(starving(8, kv_cache_usage=0.99, preemptions=3), ControllerState(), config)
    again = decide(replace(starving(4, kv_cache_usage=0.97, preemptions=2), now=2 * W,
                           in_flight=12), cut.state, config)
    assert again.settings.concurrency == 4 and "latched" in again.reason


def test_kv_at_kv_high_refuses_the_increase():
    config = cfg()
    at = decide(starving(kv_cache_usage=0.95), ControllerState(), config)
    assert at.settings.concurrency == 8
    assert "concurrency kept: kv cache 95.0% >= kv_high 95%" in at.reason
    below = decide(starving(kv_cache_usage=0.94), ControllerState(), config)
    assert below.settings.concurrency == 9
    lower = decide(starving(kv_cache_usage=0.8), ControllerState(), cfg(kv_high=0.75))
    assert lower.settings.concurrency == 8 and "kv_high 75%" in lower.reason


def test_sequences_waiting_in_the_engines_refuse_the_increase():
    d = decide(starving(kv_cache_usage=0.2, engine_waiting=3, engine_running=13),
               ControllerState(), cfg())
    assert d.settings.concurrency == 8
    assert "3 waiting in the engines" in d.reason and "13 running" in d.reason


def test_engine_signals_never_block_a_worker_scale_up():
    d = decide(starving(kv_cache_usage=1.0, engine_waiting=5),
               ControllerState(), cfg(min_workers=1, max_workers=8))
    assert d.settings.workers > 2 and d.settings.concurrency == 8


def test_kv_high_is_validated():
    with pytest.raises(ConfigError, match="kv_high"):
        cfg(kv_high=0.0)
    with pytest.raises(ConfigError, match="kv_high"):
        cfg(kv_high=1.5)


def test_static_controller_names_the_engine_signals_and_changes_nothing():
    snap = starving(kv_cache_usage=0.5, preemptions=2, engine_waiting=1)
    d = StaticController(cfg()).decide(snap, ControllerState())
    assert d.settings == snap.settings and "kv 50.0%, 2 preempted, 1 waiting" in d.reason


def test_the_record_round_trips_through_the_ledger_event_and_resumes():
    config = cfg()
    d = decide(starving(8, kv_cache_usage=0.99, preemptions=3, engine_waiting=2,
                        engine_running=14), ControllerState(), config)
    rec = json.loads(json.dumps(d.record()))
    assert {k: rec["inputs"][k] for k in ("kv_cache_usage", "engine_waiting",
                                          "engine_running", "preemptions")} == {
        "kv_cache_usage": 0.99, "engine_waiting": 2, "engine_running": 14, "preemptions": 3}
    event = ev.ControllerDecided(
        ts=W, mode="adaptive", previous=ev.LiveSettings(**rec["previous"]),
        settings=ev.LiveSettings(**rec["settings"]), bottleneck=d.bottleneck,
        reason=d.reason, inputs=rec["inputs"], state=rec["state"])
    back = msgspec.json.decode(ev.ENCODER.encode(event), type=ev.ControllerDecided)
    assert back.inputs == rec["inputs"] and back.reason == d.reason
    state = ControllerState.from_record(back.state)
    assert state == d.state and state.ceiling == 7 and state.latched
    # the resumed controller goes on exactly as the one that never stopped
    nxt = replace(starving(4, kv_cache_usage=0.5), now=2 * W, in_flight=8, completed=2000)
    assert decide(nxt, state, config) == decide(nxt, d.state, config)
    # without an engine report the inputs carry null / 0 (JSON-ready)
    plain = json.loads(json.dumps(decide(starving(), ControllerState(), config).record()))
    assert plain["inputs"]["kv_cache_usage"] is None and plain["inputs"]["preemptions"] == 0
