"""The collapse guard: the rule on synthetic rows (a collapse, a run that never learned, a
converged run, an entropy floor), the act (stop or warn, live rows only), and a real run that
it stops."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from freshroll.errors import LearningCollapsed
from freshroll.figures.learning import (
    COLLAPSE_DROP,
    COLLAPSE_STEPS,
    ENTROPY_FLOOR,
    KL_RISK,
    SMOOTH,
    CollapseWatch,
    LearningFold,
    render_learning,
)
from freshroll.observe.collapse import CollapseGuard


def _rows(rewards: list[float], zero: list[float] | None = None,
          entropy: list[float] | None = None) -> list[dict[str, Any]]:
    return [{"step": i + 1, "reward_mean": r,
             "frac_reward_zero_std": 0.0 if zero is None else zero[i],
             "entropy": 1.0 if entropy is None else entropy[i]}
            for i, r in enumerate(rewards)]


def _first(watch: CollapseWatch, rows: list[dict[str, Any]]) -> Any:
    for row in rows:
        found = watch.feed(row)
        if found is not None:
            return found
    return None


def test_a_run_that_learned_then_lost_it_without_signal_collapses() -> None:
    rising = [0.1] * SMOOTH + [0.5] * 20  # R_0 0.1, R* 0.5
    dead = [0.0] * 15
    rows = _rows(rising + dead, zero=[0.0] * len(rising) + [1.0] * len(dead))
    found = _first(CollapseWatch(5, 0.05, 0.5), rows)
    assert found is not None and found.no_signal
    assert (found.first_dead, found.step) == (31, 35)
    assert found.best == pytest.approx(0.5) and found.start == pytest.approx(0.1)
    assert found.now < 0.3  # fell by more than half of the 0.4 gained
    assert "collapsed at step 35" in found.message(True) and "trainer.lr" in found.message(True)


def test_entropy_under_the_floor_is_dead_too() -> None:
    rewards = [0.1] * SMOOTH + [0.6] * 20 + [0.05] * 10
    entropy = [1.0] * 30 + [0.01] * 10
    found = _first(CollapseWatch(4, 0.05, 0.5), _rows(rewards, entropy=entropy))
    assert found is not None and not found.no_signal and found.entropy == pytest.approx(0.01)


def test_never_learned_and_converged_runs_are_not_collapses() -> None:
    never = _rows([0.0] * 60, zero=[1.0] * 60)  # no signal from the start: R* == R_0
    assert _first(CollapseWatch(3, 0.05, 0.5), never) is None
    solved = _rows([0.2] * SMOOTH + [1.0] * 50, zero=[0.0] * SMOOTH + [1.0] * 50,
                   entropy=[1.0] * SMOOTH + [0.001] * 50)  # dead at its best reward
    assert _first(CollapseWatch(3, 0.05, 0.5), solved) is None
    dip = _rows([0.1] * SMOOTH + [0.5] * 20 + [0.0] * 2 + [0.5] * 30,
                zero=[0.0] * 30 + [1.0] * 2 + [0.0] * 30)  # dead too briefly
    assert _first(CollapseWatch(3, 0.05, 0.5), dip) is None


def test_the_guard_stops_or_warns_once_and_only_on_live_rows() -> None:
    rows = _rows([0.1] * SMOOTH + [0.5] * 20 + [0.0] * 20,
                 zero=[0.0] * 30 + [1.0] * 20)
    caught_up = CollapseGuard(CollapseWatch(3, 0.05, 0.5), True, io.StringIO())
    for row in rows:
        caught_up.on_row(row, live=False)  # a resumed run's catch-up: never acted on
    out = io.StringIO()
    warn = CollapseGuard(CollapseWatch(3, 0.05, 0.5), False, out)
    for row in rows:
        warn.on_row(row, live=True)
    said = out.getvalue().splitlines()
    assert len(said) == 1 and said[0].startswith("warning: the policy collapsed"), said
    stop = CollapseGuard(CollapseWatch(3, 0.05, 0.5), True, io.StringIO())
    with pytest.raises(LearningCollapsed, match=r"collapsed at step 3[0-9]: .*stopped"):
        for row in rows:
            stop.on_row(row, live=True)


def test_a_real_run_that_collapses_is_stopped(tmp_path: Path) -> None:
    """The real path: a reward whose values rise with the samples seen, then give every
    completion 0 (every group alike: no signal) stops the run with LearningCollapsed, and
    the run's ledger is closed and verifiable (resumable)."""
    from freshroll.config import load_config
    from freshroll.harness.verify import verify_run
    from freshroll.runtime.run import run

    (tmp_path / "rigged.py").write_text(
        "seen = 0\n"
        "def rigged(completions, **kw):\n"
        "    global seen\n"
        "    out = []\n"
        "    for i, _ in enumerate(completions):\n"
        "        seen += 1\n"
        "        step = seen // 8\n"
        "        out.append(0.0 if step >= 24 else (min(step, 20) / 20.0) * (i % 2))\n"
        "    return out\n")
    cfg = load_config(None, [
        "run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
        "rollout.batch_groups=2", "run.steps=60", "run.max_staleness=0", "run.runtime=inline",
        "run.torch_threads=1", f"rewards.0.fn={tmp_path}/rigged.py:rigged",
        "monitor.collapse_steps=4"])
    with pytest.raises(LearningCollapsed, match="the policy collapsed at step"):
        run(cfg, tmp_path / "run", stream=io.StringIO(), report=False)
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert 24 < len(rows) < 60  # stopped after the dead stretch, long before the end
    assert verify_run(tmp_path / "run").ok  # summary.json's learning figures included
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    learning = summary["learning"]
    assert learning["verdict"] == "collapsed" and learning["collapse"]["no_signal"]
    assert learning["collapse"]["step"] == len(rows)  # the guard stopped at the rule's step
    assert "collapsed at step" in render_learning(learning)


def _fold(rows: list[dict[str, Any]], max_staleness: int) -> dict[str, Any]:
    fold = LearningFold(steps=3)
    for row in rows:
        fold.row(row, max_staleness)
    result = fold.result()
    assert result is not None
    return result


def test_the_learning_verdict_reads_the_stale_steps_signals() -> None:
    base = _rows([0.1 + 0.01 * i for i in range(40)])
    calm = [{**r, "lag_mean": 1.0, "mismatch_kl": 0.005} for r in base]
    assert _fold(calm, 1)["verdict"] == "no cost seen"
    assert render_learning(_fold(calm, 1)) == ""
    far = [{**r, "lag_mean": 1.0 if i % 2 else 0.0,
            "mismatch_kl": KL_RISK * 3 if i % 2 else 0.0} for i, r in enumerate(base)]
    risky = _fold(far, 1)  # only the stale steps' KL counts: their mean is 3x the bar
    assert risky["verdict"] == "at risk" and risky["stale_steps"] == 20
    assert risky["mismatch_kl_stale"] == pytest.approx(KL_RISK * 3)
    assert "trainer.lr" in render_learning(risky) and "max_staleness" in render_learning(risky)
    assert _fold(base, 0)["verdict"] == "sync"
    dead = _rows([0.1] * SMOOTH + [0.5] * 20 + [0.0] * 10, zero=[0.0] * 30 + [1.0] * 10)
    assert _fold(dead, 0)["verdict"] == "collapsed"  # a sync run can collapse too


def test_the_monitor_defaults_are_the_rules() -> None:
    from freshroll.config.ops import MonitorSection

    m = MonitorSection()
    assert (m.collapse_steps, m.entropy_floor, m.collapse_drop) == (
        COLLAPSE_STEPS, ENTROPY_FLOOR, COLLAPSE_DROP)
    assert m.on_collapse == "stop"
