"""The report's sample completions (freshroll.report.completions)."""

from __future__ import annotations

from pathlib import Path

from freshroll.report.completions import Trained, committed_samples, completions_section, pick
from report.test_report import make_run


def _s(i: int, step: int, reward: float) -> Trained:
    return Trained(f"g{i}.0#1", step, reward, step - 1)


def test_each_step_range_shows_its_best_worst_and_a_seeded_random_sample() -> None:
    samples = [_s(i, 1 + i // 4, float(i % 5)) for i in range(36)]  # steps 1-9
    got = pick(samples)
    assert [(r, w) for r, w, _ in got] == [(r, w) for r in ("1-3", "4-6", "7-9")
                                           for w in ("best", "worst", "random")]
    best, worst = got[0][2], got[1][2]
    assert best.reward == 4.0 and worst.reward == 0.0 and 1 <= best.step <= 3
    assert got == pick(samples)  # the same page twice
    assert [r for r, _, _ in pick(samples[:4])] == ["1", "1", "1"]  # one step: one range
    assert pick([]) == []


def test_a_simulated_run_says_it_stored_no_completions(tmp_path: Path) -> None:
    run = make_run(tmp_path / "sim", steps=4)
    assert len(committed_samples(run)) > 0
    assert "No stored completions" in completions_section(run)
    assert "could not be read" in completions_section(tmp_path / "nothing")
