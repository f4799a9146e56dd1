"""The runner: a failed repeat fails ``verify`` (the others still run), the recovery gate
reads the chaos runner's cases, and OUT is claimed and replaced safely."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from freshroll.chaos.result import CaseResult, Violation
from freshroll.errors import RunDirError, RunFailed
from freshroll.validate import runner

REPO = Path(__file__).resolve().parents[2]
PLAN = {"scenarios": [
    {"name": "kill-one", "faults": [{"kind": "kill_worker", "at": {"step": 2}}]},
    {"name": "stall-one", "faults": [{"kind": "stall_worker", "at": {"step": 2}}]}]}


def _acceptance(tmp_path: Path, gates: dict[str, Any], seeds: list[int]) -> Path:
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(PLAN))
    path = tmp_path / "acc.yaml"
    path.write_text(yaml.safe_dump({
        "config": str(REPO / "configs" / "sim-p1.yaml"),
        "overrides": {"run.steps": 6, "task.n_prompts": 64, "rollout.group_size": 4,
                      "rollout.batch_groups": 2, "rollout.workers": 2,
                      "rollout.worker_batch": 8, "control.max_workers": 2},
        "seeds": seeds, "gates": gates}))
    return path


def test_a_failed_repeat_fails_verify_and_the_others_still_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from freshroll.runtime import run as run_mod

    real = run_mod.run

    def flaky(cfg: Any, out: Path, **kw: Any) -> Any:
        if cfg.run.seed == 1:
            raise RunFailed("reward fn failed 32 times in a row; first: KeyError 'x'")
        return real(cfg, out, **kw)

    monkeypatch.setattr(run_mod, "run", flaky)
    acc = _acceptance(tmp_path, {"discard_rate": {"max": 0.5}}, [0, 1])
    stream = io.StringIO()
    v = runner.validate(acc, tmp_path / "out", stream=stream)
    by = {c.name: c for c in v.decision.criteria}
    assert not by["verify"].passed
    assert "async-seed1: the run failed: reward fn failed" in by["verify"].note
    assert not by["discard_rate"].passed  # seed 1 left no figure
    assert by["discard_rate"].per_repeat[0][1] is not None
    assert v.decision.failed == ["verify", "discard_rate"]
    assert "[2/2] async-seed1" in stream.getvalue()


def test_a_failure_that_repeats_stops_the_runs(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from freshroll.runtime import run as run_mod

    calls = []

    def broken(cfg: Any, out: Path, **kw: Any) -> Any:
        calls.append(cfg.run.seed)
        raise RunFailed("engine failed 8 calls in a row; first: CUDA error")

    monkeypatch.setattr(run_mod, "run", broken)
    acc = _acceptance(tmp_path, {"lag_max": {"max": 1}}, [0, 1, 2])
    v = runner.validate(acc, tmp_path / "out", stream=io.StringIO())
    assert calls == [0, 1]  # two in a row, then the third is not run
    verify = v.decision.criteria[0]
    assert not verify.passed and verify.value == 3.0
    assert "async-seed2: not run: 2 repeats in a row failed; the first: engine failed" in \
        verify.note


def _fake_case(recovery: dict[str, float | None], violations: dict[str, int]):
    calls = []

    def run_case(plan: Any, scenario: Any, seed: int, out_dir: Path, *,
                 placement: str = "sim") -> CaseResult:
        calls.append((scenario.name, seed, out_dir, placement))
        d = out_dir / placement / scenario.name / f"seed-{seed}" / "run"
        return CaseResult(scenario.name, seed, placement, d, d.parent / "base",
                          violations=[Violation("duplicates", "x")] * violations.get(
                              scenario.name, 0),
                          recovery_s=recovery[scenario.name])
    return run_case, calls


def test_recovery_gates_read_the_chaos_cases(tmp_path: Path) -> None:
    acc = _acceptance(tmp_path, {"recovery": {
        "plan": "plan.yaml", "scenarios": ["kill-one", "stall-one"], "max_s": 30,
        "seeds": [3, 4]}}, [0])
    fake, calls = _fake_case({"kill-one": 12.0, "stall-one": None}, {"kill-one": 1})
    v = runner.validate(acc, tmp_path / "out", stream=io.StringIO(), run_case=fake)
    assert [(n, s) for n, s, _, _ in calls] == [("kill-one", 3), ("kill-one", 4),
                                                ("stall-one", 3), ("stall-one", 4)]
    assert all(o == tmp_path / "out" / "recovery" and p == "sim" for _, _, o, p in calls)
    by = {c.name: c for c in v.decision.criteria}
    assert by["recovery_s[kill-one]"].passed and by["recovery_s[kill-one]"].value == 12.0
    assert not by["recovery_s[stall-one]"].passed  # never recovered
    assert not by["chaos_invariants"].passed and by["chaos_invariants"].value == 2.0
    assert v.decision.failed == ["recovery_s[stall-one]", "chaos_invariants"]
    assert len(v.decision.recovery) == 4


def test_recovery_without_the_harness_fails_with_a_clear_error(tmp_path: Path) -> None:
    acc = _acceptance(tmp_path, {"recovery": {
        "plan": "plan.yaml", "scenarios": ["kill-one"], "max_s": 30}}, [0])

    def missing(*a: Any, **kw: Any) -> CaseResult:
        raise ModuleNotFoundError("No module named 'freshroll.chaos.inject'")

    v = runner.validate(acc, tmp_path / "out", stream=io.StringIO(), run_case=missing)
    c = next(c for c in v.decision.criteria if c.name == "recovery_s[kill-one]")
    assert not c.passed and "chaos harness is incomplete" in c.note
    assert v.decision.recommendation == "stop"


def test_claim(tmp_path: Path) -> None:
    acc = tmp_path / "a.yaml"
    acc.write_text("seeds: 1\n")
    out = tmp_path / "out"
    runner._claim(out, acc)
    (out / "async-seed0").mkdir()
    (out / "decision.md").write_text("old")
    (out / "mine.txt").write_text("kept")
    runner._claim(out, acc)  # a previous validation's directory: its run dirs replaced
    assert not (out / "async-seed0").exists() and not (out / "decision.md").exists()
    assert (out / "mine.txt").is_file()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(RunDirError, match="not a validation's directory"):
        runner._claim(tmp_path / "busy", acc)
    with pytest.raises(RunDirError, match="is a file"):
        runner._claim(acc, acc)


def test_learning_of_reads_the_summarys_learning_block(tmp_path: Path) -> None:
    from freshroll.validate.runner import learning_of

    assert learning_of(tmp_path) == {"collapsed": None, "mismatch_kl_stale": None}
    (tmp_path / "summary.json").write_text(json.dumps({"learning": {
        "verdict": "collapsed", "mismatch_kl_stale": 0.03, "stale_steps": 9}}))
    assert learning_of(tmp_path) == {"collapsed": 1.0, "mismatch_kl_stale": 0.03}
    (tmp_path / "summary.json").write_text(json.dumps({"learning": {
        "verdict": "no cost seen", "mismatch_kl_stale": None, "stale_steps": 0}}))
    assert learning_of(tmp_path) == {"collapsed": 0.0, "mismatch_kl_stale": 0.0}
