"""The decision record: diagnosis rules, recommendation, markdown sections, JSON round trip."""

from __future__ import annotations

import json
from pathlib import Path

from freshroll.config import validate as validate_config
from freshroll.validate.gates import Case, Repeat, bound_gate, recovery_gates, verify_gate
from freshroll.validate.record import (
    PRODUCTION,
    SECTIONS,
    STOP,
    build,
    diagnose,
    read_decision,
    recommend,
    render_markdown,
    sections,
    write,
)


def _sig(mode: str, idle: float, **bottlenecks: int) -> dict:
    return {"label": f"{mode}-seed0", "mode": mode, "run_dir": f"/o/{mode}-seed0", "ok": True,
            "bottlenecks": bottlenecks, "fences": {"lost": 1}, "faults": {},
            "rejected": {"late": 2}, "discards": {"stale": 3}, "trainer_idle_ratio": idle,
            "top_stage": {"stage": "trainer", "share": 0.5}, "verdict": "complete",
            "first_failure": {"stale": {"count": 3, "first": "lag 3 > 2"}}}


def test_bottleneck_from_the_controllers_decisions() -> None:
    d = diagnose([_sig("async", 0.5, trainer=6, balanced=3), _sig("sync", 0.9, producer=9)],
                 idle_high=0.03)
    assert d["bottleneck"] == "trainer-bound"  # the async repeats' votes, not the sync ones
    assert "trainer-bound 6" in d["basis"] and d["dominant_stage"] == "trainer"


def test_bottleneck_from_idle_without_decisions() -> None:
    assert diagnose([_sig("async", 0.2)], idle_high=0.03)["bottleneck"] == "generation-bound"
    assert diagnose([_sig("async", 0.01)], idle_high=0.03)["bottleneck"] == "trainer-bound"
    assert diagnose([], idle_high=0.03)["bottleneck"] == "unknown"


def _criteria(fail: bool) -> list:
    runs = [Repeat("async-seed0", "async", 0, "/o/async-seed0",
                   {"discard_rate": 0.3 if fail else 0.1})]
    return [verify_gate(runs), bound_gate("discard_rate", "d", "<=", 0.2, runs, "discard_rate"),
            *recovery_gates(9.0, ["kill"], [Case("kill", 0, "/o/recovery/kill", None)])]


def test_recommendation_names_every_failed_gate() -> None:
    rec, bad = recommend(_criteria(fail=True))
    assert rec == STOP and bad == ["discard_rate", "recovery_s[kill]"]
    assert recommend(_criteria(fail=False)[:2]) == (PRODUCTION, [])
    assert recommend([])[0] == STOP  # nothing gated is not an acceptance


def test_record_round_trip_and_sections(tmp_path: Path) -> None:
    cfg = validate_config({"run": {"max_staleness": 2}, "control": {"mode": "adaptive"}})
    d = build(name="t", acceptance="acc.yaml", cfg=cfg, seeds=[0], criteria=_criteria(True),
              signals=[_sig("async", 0.2, trainer=2)], recovery=[], wall_s=1.5,
              environment={"cpus": 2, "loadavg_start": 4.6, "loadavg_end": 1.0})
    md_path, js_path = write(d, tmp_path)
    back = read_decision(js_path)
    assert back == d  # every field, inf recovery included
    assert json.loads(js_path.read_text())["recommendation"] == STOP
    md = md_path.read_text()
    assert sections(md) == list(SECTIONS)
    assert "failed gates: discard_rate, recovery_s[kill]" in md
    assert "| max_staleness | 2 (synchronous baseline: 0) |" in md
    assert "mode adaptive" in md  # the controller's settings in force
    assert "| discard_rate | <= 0.2 | 0.3 |" in md
    assert "| recovery_s[kill] | <= 9 | inf |" in md
    assert "late 2" in md and "lost 1" in md and "stale 3" in md  # failure signals
    assert "- Machine: 2 CPUs; load average 4.60 at the start" in md
    assert "other work competed for the CPUs" in md  # a contended machine is said so
    assert render_markdown(back, tmp_path) == md
